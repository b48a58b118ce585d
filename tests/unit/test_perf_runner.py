"""perf's HTTP client and load loops against a tiny in-process HTTP server whose answers the test controls."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

from smtriton.perf.bodies import Body
from smtriton.perf.runner import ServerGone, StepPlan, closed_loop, open_loop, run_steps
from smtriton.perf.targets import RECONNECT_PAUSE_S, HttpTarget

Answer = Callable[[int], tuple[int, bool]]  # request number -> (status, close the connection after it)


async def serve_fake(
    answer: Answer, delay_s: float = 0.0, first_delay_s: float = 0.0
) -> tuple[asyncio.AbstractServer, dict[str, int]]:
    """An HTTP/1.1 server that reads whole requests (Content-Length bodies) and answers as ``answer`` says."""
    seen = {"requests": 0, "connections": 0, "target_model_header": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen["connections"] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                headers = dict(line.split(": ", 1) for line in head.decode("latin-1").split("\r\n")[1:] if ": " in line)
                await reader.readexactly(int(headers["Content-Length"]))
                seen["target_model_header"] += "X-Amzn-SageMaker-Target-Model" in headers
                number = seen["requests"]
                seen["requests"] += 1
                status, close = answer(number)
                if number == 0 and first_delay_s:  # a model loaded on its first request, say
                    await asyncio.sleep(first_delay_s)
                if delay_s:
                    await asyncio.sleep(delay_s)
                body = b'{"outputs": []}'
                extra = b"Connection: close\r\n" if close else b""
                writer.write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n%s\r\n%s" % (status, len(body), extra, body))
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, seen


def run_against(
    answer: Answer,
    step: Callable[[HttpTarget], Awaitable],
    delay_s: float = 0.0,
    model: str | None = None,
    first_delay_s: float = 0.0,
):
    async def main():
        server, seen = await serve_fake(answer, delay_s, first_delay_s)
        port = server.sockets[0].getsockname()[1]
        target = HttpTarget(f"http://127.0.0.1:{port}", [Body(b'{"inputs": []}', "application/json")], model)
        try:
            result = await asyncio.wait_for(step(target), timeout=20)
        finally:
            target.close()
            server.close()
        return result, seen

    return asyncio.run(main())


def test_a_closed_loop_counts_every_request_the_server_answered():
    plan = StepPlan("concurrency", 4, warmup_s=0.2, duration_s=0.5)
    result, seen = run_against(lambda n: (200, False), lambda t: closed_loop(t, plan))
    assert result.sent_total == seen["requests"] > result.requests > 0
    assert result.errors == {}
    assert seen["connections"] == 4  # one keep-alive connection per worker
    lat = result.latency_ms
    assert lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99.9"]


def test_the_warm_up_lasts_until_every_worker_has_its_first_answer():
    """The first request waits 1 s (a multi-model endpoint loading the model): the measured window opens
    after it, so it measures the model, not the load."""
    plan = StepPlan("concurrency", 1, warmup_s=0.1, duration_s=0.4)
    result, seen = run_against(lambda n: (200, False), lambda t: closed_loop(t, plan), first_delay_s=1.0)
    assert result.requests > 0
    assert result.latency_ms["p99.9"] < 500
    assert seen["requests"] > result.requests  # the slow first answer was warm-up


def test_errors_are_counted_by_status_and_closed_connections_reopen():
    plan = StepPlan("concurrency", 2, warmup_s=0.0, duration_s=0.5)
    result, seen = run_against(lambda n: (503 if n % 4 == 0 else 200, n % 10 == 0), lambda t: closed_loop(t, plan))
    assert set(result.errors) == {"503"}
    assert result.errors["503"] == pytest.approx(result.requests / 4, rel=0.2)
    assert result.ok + result.errors["503"] == result.requests
    assert seen["connections"] > 2  # the server closed some; the client reconnected and went on


def test_an_unreachable_server_is_a_connection_error_not_a_crash():
    async def step(target: HttpTarget):
        target.port = 1  # nothing listens on port 1
        return await closed_loop(target, StepPlan("concurrency", 1, warmup_s=0.0, duration_s=0.2))

    result, _ = run_against(lambda n: (200, False), step)
    assert result.ok == 0
    assert result.errors["connection"] > 0


def test_an_open_loop_keeps_its_rate_and_measures_from_the_schedule():
    plan = StepPlan("rate", 200, warmup_s=0.2, duration_s=1.0, arrival="fixed", connections=8)
    result, seen = run_against(lambda n: (200, False), lambda t: open_loop(t, plan), model="m.tar.gz")
    assert result.throughput_rps == pytest.approx(200, rel=0.1)
    assert seen["requests"] == result.sent_total == pytest.approx(240, abs=3)
    assert seen["target_model_header"] == seen["requests"]


def test_an_open_loop_above_capacity_reports_the_true_tail_and_the_shortfall():
    """2 connections, 20 ms per answer: at most 100/s served, 200/s offered. Every request scheduled in
    the window is measured, those still queued when it closes included, so the tail is the queue's."""
    rate, service_s, lanes = 200, 0.02, 2
    plan = StepPlan("rate", rate, warmup_s=0.0, duration_s=0.6, arrival="fixed", connections=lanes)
    result, seen = run_against(lambda n: (200, False), lambda t: open_loop(t, plan), delay_s=service_s)
    scheduled = int(rate * plan.duration_s)
    assert result.requests == result.ok == scheduled  # not only the ones that finished in time
    assert seen["requests"] == scheduled
    # However the answers come, the k-th can end no sooner than (k + 1) / lanes service times after the
    # first started, and it was due k / rate after it: a floor under every latency, and under the p99.
    floor = [np.ceil((k + 1) / lanes) * service_s - k / rate for k in range(scheduled)]
    assert result.latency_ms["p99"] >= np.percentile(floor, 99) * 1000
    assert result.offered_rps == pytest.approx(rate, rel=0.05)
    assert result.throughput_rps <= lanes / service_s * 1.05
    assert result.short
    assert any("fell short of the offered rate" in note for note in result.notes)


def test_an_open_loop_within_capacity_is_not_short():
    plan = StepPlan("rate", 100, warmup_s=0.1, duration_s=0.8, arrival="fixed", connections=8)
    result, _ = run_against(lambda n: (200, False), lambda t: open_loop(t, plan), delay_s=0.002)
    assert result.requests == 80
    assert not result.short
    assert not any("short" in note for note in result.notes)


def test_requests_still_unanswered_after_the_step_are_errors_not_dropped(monkeypatch):
    """A request that never comes back counts, as a timeout, against the step that scheduled it."""
    monkeypatch.setattr("smtriton.perf.runner.DRAIN_TIMEOUT_S", 0.3)
    plan = StepPlan("rate", 20, warmup_s=0.0, duration_s=0.5, arrival="fixed", connections=4)
    result, _ = run_against(lambda n: (200, False), lambda t: open_loop(t, plan), delay_s=5.0)
    assert result.requests == 10
    assert result.errors == {"timeout": 10}
    assert result.ok == 0


def _going_away_after(after_s: float, step: Callable[[HttpTarget], Awaitable]):
    """Run ``step`` against a server that answers for ``after_s`` seconds, then stops listening and drops its
    connections (serve stopped with Ctrl-C); what the step raised, how many connections were tried."""

    async def main():
        writers: list[asyncio.StreamWriter] = []
        server: asyncio.AbstractServer | None = None

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = next(
                        int(line.split(b": ")[1]) for line in head.split(b"\r\n") if line.startswith(b"Content-Length")
                    )
                    await reader.readexactly(length)
                    if time.perf_counter() - began > after_s:
                        assert server is not None
                        server.close()
                        for w in writers:
                            w.close()
                        return
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass

        began = time.perf_counter()
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        target = HttpTarget(f"http://127.0.0.1:{port}", [Body(b'{"inputs": []}', "application/json")], None)
        connects = 0
        real = target.channel

        async def counting_channel():
            channel = await real()
            connect = channel._connect

            async def counted():
                nonlocal connects
                connects += 1
                return await connect()

            channel._connect = counted
            return channel

        target.channel = counting_channel
        try:
            with pytest.raises(ServerGone) as raised:
                await asyncio.wait_for(step(target), timeout=20)
        finally:
            target.close()
        return raised.value, connects, time.perf_counter() - began

    return asyncio.run(main())


@pytest.mark.parametrize("mode", ["concurrency", "rate"])
def test_a_server_that_goes_away_mid_run_stops_the_step_in_one_line(monkeypatch, mode):
    """serve stopped at c=8: the step stops once nothing has answered for GONE_AFTER_S (not after its whole
    duration, and without spinning on refused connections), and says why."""
    monkeypatch.setattr("smtriton.perf.runner.GONE_AFTER_S", 0.5)
    plan = (
        StepPlan("concurrency", 8, warmup_s=0.1, duration_s=15.0)
        if mode == "concurrency"
        else StepPlan("rate", 400, warmup_s=0.1, duration_s=15.0, connections=8)
    )
    step = closed_loop if mode == "concurrency" else open_loop
    gone, connects, seconds = _going_away_after(0.3, lambda t: step(t, plan))
    assert seconds < 0.3 + 5
    assert re.fullmatch(
        rf"the server stopped answering during {re.escape(plan.label)}: \d+ requests in a row got no answer "
        r"\(refused or cut off\) over 0\.\d s; the run stops here",
        str(gone),
    )
    assert connects < 8 * 2 / RECONNECT_PAUSE_S  # each connection waits between refused tries


def test_the_steps_before_the_server_went_away_are_kept(monkeypatch):
    monkeypatch.setattr("smtriton.perf.runner.GONE_AFTER_S", 0.5)
    plans = [StepPlan("concurrency", 1, warmup_s=0.0, duration_s=0.3), StepPlan("concurrency", 4, 0.0, 15.0)]
    gone, _, _ = _going_away_after(0.8, lambda t: run_steps(t, plans))
    assert [r.label for r in gone.results] == ["c=1"]
    assert gone.results[0].ok > 0
    assert "during c=4" in str(gone)
