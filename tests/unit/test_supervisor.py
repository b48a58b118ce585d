"""The real Triton supervisor, driving a stand-in tritonserver: a small program that answers Triton's
health endpoint on the port it is given, so start-up, hooks, restarts and stop run for real."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from smtriton.serve.errors import TritonUnavailable
from smtriton.serve.settings import Settings
from smtriton.serve.triton import supervisor as supervisor_module
from smtriton.serve.triton.installation import TritonInstallation
from smtriton.serve.triton.supervisor import TritonState, TritonSupervisor

STAND_IN = textwrap.dedent(
    """\
    #!{python}
    import http.server, signal, sys
    port = int(next(a for a in sys.argv if a.startswith("--http-port=")).split("=")[1])
    class Live(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/v2/health/live" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()
        def log_message(self, *args):
            pass
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    http.server.HTTPServer(("127.0.0.1", port), Live).serve_forever()
    """
)


@pytest.fixture
def installation(tmp_path: Path) -> TritonInstallation:
    binary = tmp_path / "bin" / "tritonserver"
    binary.parent.mkdir()
    binary.write_text(STAND_IN.format(python=sys.executable))
    binary.chmod(0o755)
    backends = tmp_path / "backends" / "python"
    backends.mkdir(parents=True)
    (backends / "libtriton_python.so").write_bytes(b"")
    return TritonInstallation(binary=binary, backends=backends.parent)


def _supervisor(tmp_path: Path, installation: TritonInstallation, **hooks) -> TritonSupervisor:
    repository = tmp_path / "repo"
    repository.mkdir(exist_ok=True)
    settings = Settings(startup_timeout_s=20, triton_exit_timeout_s=1)
    return TritonSupervisor(settings, installation, repository, tmp_path, **hooks)


async def _until(predicate, timeout: float) -> None:
    """Poll ``predicate`` (the supervisor offers no event for every state a test looks for)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "not reached in time"
        await asyncio.sleep(0.02)


@pytest.fixture
def short_backoff(monkeypatch) -> tuple[float, float]:
    """The supervisor's back-off, scaled down: the first wait and the longest one."""
    monkeypatch.setattr(supervisor_module, "FIRST_BACKOFF_S", 0.05)
    monkeypatch.setattr(supervisor_module, "MAX_BACKOFF_S", 0.15)
    monkeypatch.setattr(supervisor_module, "WATCH_EXIT_GRACE_S", 0.05)
    return 0.05, 0.15


def _waits(caplog: pytest.LogCaptureFixture, pattern: str) -> list[float]:
    """The back-offs the supervisor announced in its log lines that match ``pattern`` (one group)."""
    return [float(m.group(1)) for r in caplog.records if (m := re.search(pattern, r.getMessage()))]


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (
            TritonUnavailable("Triton is not reachable: ServerDisconnectedError"),
            "Triton is not reachable: ServerDisconnectedError",  # its message, as /ping's callers see it
        ),
        (RuntimeError("a bug in the hook"), "a bug in the hook"),
        (ValueError(), "ValueError"),  # no message: its class says what failed
    ],
    ids=["serve-error", "plain-exception", "plain-exception-without-message"],
)
def test_a_hook_that_fails_is_a_failed_start_retried_with_back_off(
    tmp_path, installation, short_backoff, caplog, failure, reason
):
    """A failing on_live hook (Triton dying again while models are restored, say) stops the Triton it
    started and starts another after the back-off, which doubles each time up to its longest; supervision
    never ends on it, whatever the hook raises."""
    first_wait, longest_wait = short_backoff
    caplog.set_level(logging.ERROR, logger="serve")

    async def scenario() -> None:
        calls: list[int] = []

        async def on_live() -> None:
            calls.append(supervisor.process.pid)  # type: ignore[union-attr]
            if len(calls) <= 3:
                raise failure

        changes: list[TritonState] = []
        supervisor = _supervisor(
            tmp_path, installation, on_live=on_live, on_change=lambda: changes.append(supervisor.state)
        )
        supervisor.start()
        try:
            await _until(lambda: supervisor.live, 60)
            assert len(calls) == 4
            assert len(set(calls)) == 4  # a fresh Triton each start
            assert all(_gone(pid) for pid in calls[:3])  # the Tritons whose hook failed were stopped
            assert TritonState.DOWN in changes  # /ping failed meanwhile
            assert supervisor.running
        finally:
            await supervisor.stop()
        assert not supervisor.running

    asyncio.run(scenario())
    failed = [r.getMessage() for r in caplog.records if "failed to start" in r.getMessage()]
    assert len(failed) == 3
    assert all(f"failed to start: {reason}; retrying in" in line for line in failed), failed
    # Doubled each time, then held at the longest: no busy loop, and no wait past the cap.
    assert _waits(caplog, r"failed to start: .*; retrying in ([\d.]+) s") == [
        first_wait,
        2 * first_wait,
        longest_wait,
    ]


def test_a_triton_that_dies_while_its_hook_runs_is_started_again(tmp_path, installation):
    """The hook's calls to a Triton killed meanwhile may never answer (its backend stubs keep the
    connection open): Triton's exit ends the hook and fails the start, at once."""

    async def scenario() -> None:
        hooked = asyncio.Event()
        calls = 0

        async def on_live() -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                hooked.set()
                await asyncio.Event().wait()  # a call that never answers

        supervisor = _supervisor(tmp_path, installation, on_live=on_live)
        supervisor.start()
        try:
            await asyncio.wait_for(hooked.wait(), 30)
            os.kill(supervisor.process.pid, signal.SIGKILL)  # type: ignore[union-attr]
            await _until(lambda: supervisor.live, 30)
            assert calls == 2
        finally:
            await supervisor.stop()

    asyncio.run(scenario())


def test_a_listener_that_raises_does_not_stop_the_supervision(tmp_path, installation, caplog):
    caplog.set_level(logging.ERROR, logger="serve")
    called: list[str] = []

    def broken(which: str):
        def listener() -> None:
            called.append(which)
            raise RuntimeError(f"a bug in {which}")

        return listener

    async def scenario() -> None:
        supervisor = _supervisor(tmp_path, installation, on_change=broken("on_change"), on_exit=broken("on_exit"))
        supervisor.start()
        try:
            await _until(lambda: supervisor.live, 30)
            assert "on_change" in called  # the broken listener ran, and the start went on past it
            pid = supervisor.process.pid  # type: ignore[union-attr]
            os.kill(pid, signal.SIGKILL)  # dies on its own: on_exit (broken) runs, then a restart
            await _until(lambda: supervisor.live and supervisor.process.pid != pid, 30)  # type: ignore[union-attr]
            assert called.count("on_exit") == 1  # once for the one exit, before the restart
        finally:
            await supervisor.stop()

    asyncio.run(scenario())
    failures = [r for r in caplog.records if r.getMessage() == "a listener of the Triton supervisor failed"]
    # Each failing call logged once, with its traceback: none silently swallowed, none logged twice.
    assert len(failures) == len(called)
    assert all(r.exc_info is not None and isinstance(r.exc_info[1], RuntimeError) for r in failures)
    assert {str(r.exc_info[1]) for r in failures if r.exc_info} == {"a bug in on_change", "a bug in on_exit"}


def test_a_watch_that_fails_is_logged_and_run_again_with_back_off_while_triton_stays_up(
    tmp_path, installation, short_backoff, caplog
):
    """The watch (model health) is not Triton: one that raises is logged and run again after a growing
    back-off, against the same Triton, which is neither restarted nor reported down; stop() cancels it."""
    first_wait, longest_wait = short_backoff
    caplog.set_level(logging.ERROR, logger="serve")

    async def scenario() -> None:
        pids: list[int] = []
        watching = asyncio.Event()
        cancelled = asyncio.Event()
        exits: list[TritonState] = []

        async def watch() -> None:
            pids.append(supervisor.process.pid)  # type: ignore[union-attr]
            if len(pids) <= 3:
                raise RuntimeError(f"a bug in the watch ({len(pids)})")
            watching.set()
            try:
                await asyncio.Event().wait()  # watches for good now
            except asyncio.CancelledError:
                cancelled.set()
                raise

        supervisor = _supervisor(tmp_path, installation, watch=watch, on_exit=lambda: exits.append(supervisor.state))
        supervisor.start()
        try:
            await asyncio.wait_for(watching.wait(), 30)
            assert len(pids) == 4
            assert len(set(pids)) == 1  # always the same Triton: never restarted for the watch's faults
            assert supervisor.live
            assert supervisor.running
            assert exits == []
        finally:
            await supervisor.stop()
        assert cancelled.is_set()  # stop() ended the watch, and waited for it

    asyncio.run(scenario())
    failed = [r for r in caplog.records if "the Triton watch failed" in r.getMessage()]
    assert len(failed) == 3  # each failure logged once
    assert failed[0].exc_info is not None  # the traceback, the first time in a row
    assert str(failed[0].exc_info[1]) == "a bug in the watch (1)"
    assert [r.exc_info for r in failed[1:]] == [None, None]  # then one line each
    assert "a bug in the watch (3)" in failed[2].getMessage()
    assert _waits(caplog, r"the Triton watch failed.*; restarting it in ([\d.]+) s") == [
        first_wait,
        2 * first_wait,
        longest_wait,
    ]
    assert not any("tritonserver" in r.getMessage() for r in caplog.records)  # no failed start, no exit


def test_a_watch_that_fails_because_triton_died_says_nothing_and_the_restart_watches_again(
    tmp_path, installation, short_backoff, caplog
):
    """A watch whose Triton died under it fails too (its calls find no Triton): the exit is what is
    reported and acted on, and the restarted Triton gets a watch of its own."""
    caplog.set_level(logging.ERROR, logger="serve")

    async def scenario() -> None:
        pids: list[int] = []
        first_watching = asyncio.Event()
        second_watching = asyncio.Event()

        async def watch() -> None:
            process = supervisor.process
            assert process is not None
            pids.append(process.pid)
            if len(pids) == 1:
                first_watching.set()
                await process.exited()
                raise TritonUnavailable("Triton is not reachable: ClientConnectorError")
            second_watching.set()
            await asyncio.Event().wait()

        supervisor = _supervisor(tmp_path, installation, watch=watch)
        supervisor.start()
        try:
            await asyncio.wait_for(first_watching.wait(), 30)
            os.kill(pids[0], signal.SIGKILL)
            await asyncio.wait_for(second_watching.wait(), 30)
            assert len(pids) == 2
            assert pids[0] != pids[1]  # the restarted Triton's watch
        finally:
            await supervisor.stop()

    asyncio.run(scenario())
    assert not any("watch" in r.getMessage() for r in caplog.records)
    assert any("exited unexpectedly" in r.getMessage() for r in caplog.records)


def test_ports_and_client_follow_each_restart(tmp_path, installation):
    async def scenario() -> None:
        supervisor = _supervisor(tmp_path, installation)
        supervisor.start()
        try:
            await _until(lambda: supervisor.live, 30)
            first = supervisor.ports
            assert first is not None
            assert await supervisor.running_client().server_live()
            os.kill(supervisor.process.pid, signal.SIGKILL)  # type: ignore[union-attr]
            await _until(lambda: not supervisor.live, 5)
            await _until(lambda: supervisor.live, 30)
            assert supervisor.ports is not None
            assert supervisor.ports.http != first.http  # a fresh free port each start
            assert await supervisor.running_client().server_live()
        finally:
            await supervisor.stop()
        assert supervisor.state is TritonState.STOPPING

    asyncio.run(scenario())


def _gone(pid: int) -> bool:
    """No such process, or only its exit status left (a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True
