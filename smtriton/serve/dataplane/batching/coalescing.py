"""A worker's requests to one model, merged while that model's earlier requests are still with Triton.

Never waits to fill a batch: a request goes to Triton at once while fewer than a bound of the model's
requests from this worker are in flight there (a request alone, at c=1, goes at once). Only requests
that arrive while the bound is reached wait, and only until one of those in flight comes back: then
the requests waiting that may merge (:mod:`smtriton.serve.dataplane.batching.mergeable`) go as one Triton
request, as many rows as the model's ``max_batch_size`` takes, and the answer is split back. The bound
is a few requests per model instance (``SMTRITON_MERGE_IN_FLIGHT`` each), shared among the front's
workers, since they all feed the one Triton: enough for every instance to have one executing and one
queued, so Triton never idles for want of work, and no more, so that what arrives meanwhile is merged
rather than queued inside Triton one request at a time. Each worker keeps its even share, rounded up:
8 workers in front of 8 instances keep 2 each, not 16 each (with 16 each, 64 clients never met the
bound and nothing was ever merged). And never less than one instance's worth: a share of one made a
worker's second request wait a whole round trip to merge with little or nothing (2 workers, one
instance, 4 clients: 13 % fewer answers than with 2 each).

A merged request Triton fails for a client's rows (a 400, a model's error), or answers in a way that
cannot be split, is sent again unmerged: each client gets the answer it would have got alone, its own
error included. One Triton refuses as a whole (unavailable, its queue full, out of time:
:func:`~smtriton.serve.dataplane.batching.merging.refused_as_a_whole`), and a transport failure (Triton
unreachable, out of time), is each client's own such failure, never sent again row by row.

Only while merging pays (:mod:`~smtriton.serve.dataplane.batching.row_time`): a model whose Triton
execution takes ``SMTRITON_MERGE_MAX_ROW_MS`` or more per row, by Triton's own statistics (read off the
request path, at most one reading a model at a time, every few seconds while it is used), has its
requests sent each at once, however many are in flight, as if merging were off for it; the requests
waiting when that verdict comes go at once too. A reading that fails keeps the verdict. The same
readings say how busy the model's instances were while this worker had requests with them: under half
busy, one request in flight per instance is enough, and the bound is that (what arrives meanwhile
merges deeper).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from smtriton.serve.dataplane.batching import mergeable, merging
from smtriton.serve.dataplane.batching.mergeable import Part
from smtriton.serve.dataplane.batching.row_time import Statistics, Verdict
from smtriton.serve.dataplane.batching.rule import ModelBatching
from smtriton.serve.dataplane.reading.inference import Inference
from smtriton.serve.eventloop import LoopOfFirstUse
from smtriton.serve.metrics import Metrics
from smtriton.serve.triton.client import UpstreamResponse

log = logging.getLogger("serve")

# Sends one request to one Triton model and returns Triton's answer.
Send = Callable[[str, Inference], Awaitable[UpstreamResponse]]

_SLOT = object()  # a waiting request's answer: a place in flight is yours, send your request
_ALONE = object()  # a waiting request's answer: the merged request failed, send yours alone


class _Waiting:
    __slots__ = ("answer", "part")

    def __init__(self, part: Part, loop: asyncio.AbstractEventLoop) -> None:
        self.part = part
        self.answer: asyncio.Future[Any] = loop.create_future()


class _Lane:
    """One model's requests from this worker: how many are with Triton, those waiting to go, whether
    merging them pays, and for how long the worker has had some with Triton."""

    __slots__ = ("_since", "active_s", "in_flight", "model", "verdict", "waiting")

    def __init__(self, model: ModelBatching) -> None:
        self.model = model
        self.in_flight = 0
        self.waiting: deque[_Waiting] = deque()
        self.verdict = Verdict()
        self.active_s = 0.0  # seconds with requests in flight, up to the last time none were
        self._since = 0.0  # when the requests now in flight began to be

    def sent(self, loop: asyncio.AbstractEventLoop) -> None:
        """One more request of the lane is with Triton."""
        if not self.in_flight:
            self._since = loop.time()
        self.in_flight += 1

    def answered(self, loop: asyncio.AbstractEventLoop) -> None:
        """One request of the lane is no longer with Triton."""
        self.in_flight -= 1
        if not self.in_flight:
            self.active_s += loop.time() - self._since

    def active(self, loop: asyncio.AbstractEventLoop) -> float:
        """Seconds the worker has had requests of the lane with Triton, until now."""
        return self.active_s + (loop.time() - self._since if self.in_flight else 0.0)


class Coalescer:
    """Requests to Triton through ``send``, merged per model while its bound of requests is in flight and
    while, by ``statistics`` (Triton's of a model), Triton executes a row of it in under ``max_row_ms``
    (0: always)."""

    def __init__(
        self,
        send: Send,
        in_flight_per_instance: int,
        metrics: Metrics,
        workers: int = 1,
        statistics: Statistics | None = None,
        max_row_ms: float = 0.0,
    ) -> None:
        self._send = send
        self._per_instance = in_flight_per_instance
        self._workers = max(1, workers)
        self._metrics = metrics
        self._statistics = statistics if max_row_ms > 0 else None
        self._max_row_ms = max_row_ms
        self._lanes: dict[str, _Lane] = {}
        self._sending: set[asyncio.Task[None]] = set()
        self._reading: set[asyncio.Task[None]] = set()
        self._loop = LoopOfFirstUse()

    def bound(self, model: ModelBatching, one_each: bool = False) -> int:
        """Requests of a model this worker keeps in flight before it merges the next ones: its share of
        what all the workers together keep, rounded up, and at least what one instance is given; with
        ``one_each`` (the instances were under half busy: :mod:`row_time`), one per instance."""
        per_instance = 1 if one_each else self._per_instance
        return max(per_instance, -(-model.instances * per_instance // self._workers))

    async def infer(self, triton_name: str, inference: Inference, model: ModelBatching) -> UpstreamResponse:
        """Triton's answer to ``inference``, as it would have been alone."""
        lane = self._lanes.get(triton_name)
        if lane is None:
            lane = self._lanes[triton_name] = _Lane(model)
        lane.model = model
        if self._statistics is not None:
            self._judge(lane, triton_name, self._statistics)
        if lane.in_flight < self.bound(model, lane.verdict.one_each) or not lane.verdict.pays:
            lane.sent(self._loop.get())
            return await self._send_in_lane(lane, triton_name, inference)
        item = mergeable.part(inference, model)
        if item is None:
            return await self._send(triton_name, inference)
        waiting = _Waiting(item, self._loop.get())
        lane.waiting.append(waiting)
        try:
            answer = await waiting.answer
        except asyncio.CancelledError:
            if _given_a_slot(waiting.answer):  # handed a place just as the client left: pass it on
                self._release(lane, triton_name)
            raise
        if answer is _SLOT:
            return await self._send_in_lane(lane, triton_name, inference)
        if answer is _ALONE:
            return await self._send(triton_name, inference)
        assert isinstance(answer, UpstreamResponse)
        return answer

    async def _send_in_lane(self, lane: _Lane, triton_name: str, inference: Inference) -> UpstreamResponse:
        try:
            return await self._send(triton_name, inference)
        finally:
            self._release(lane, triton_name)

    def _release(self, lane: _Lane, triton_name: str) -> None:
        """A request of the lane came back: what waits goes, merged, as far as the bound allows."""
        loop = self._loop.get()
        lane.answered(loop)
        while lane.in_flight < self.bound(lane.model, lane.verdict.one_each):
            group = _next_group(lane)
            if not group:
                break
            lane.sent(loop)
            if len(group) == 1:
                group[0].answer.set_result(_SLOT)  # alone: the client's own coroutine sends it
                continue
            task = self._loop.get().create_task(self._send_group(lane, triton_name, group))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send_group(self, lane: _Lane, triton_name: str, group: list[_Waiting]) -> None:
        """Send ``group`` merged; each waiting client gets its part of the answer (or sends alone)."""
        try:
            answers = await self._merged(triton_name, group, lane.model)
        except asyncio.CancelledError:
            for waiting in group:
                waiting.answer.cancel()
            raise
        except Exception as exc:  # each client's own failure, as alone (its own copy: tracebacks differ)
            for waiting in group:
                if not waiting.answer.done():
                    waiting.answer.set_exception(copy.copy(exc))
            return
        finally:
            self._release(lane, triton_name)
        if answers is None:
            self._metrics.unmerged_again.inc(len(group))
        for index, waiting in enumerate(group):
            if not waiting.answer.done():
                waiting.answer.set_result(_ALONE if answers is None else answers[index])

    async def _merged(
        self, triton_name: str, group: list[_Waiting], model: ModelBatching
    ) -> list[UpstreamResponse] | None:
        try:
            merged = merging.merge([waiting.part for waiting in group])
        except Exception:  # a bug in the merge: the requests still go, alone
            log.exception("merging %d requests to %s failed; sent alone", len(group), triton_name)
            return None
        response = await self._send(triton_name, merged.inference)
        self._metrics.merged(len(group))
        if merging.refused_as_a_whole(response):
            return [response] * len(group)
        return merged.split(response, model)

    def _judge(self, lane: _Lane, triton_name: str, statistics: Statistics) -> None:
        """Begin a reading of the model's statistics if one is due, off the request path."""
        verdict = lane.verdict
        now = self._loop.get().time()
        if not verdict.due(now):
            return
        verdict.read_at = now
        task = verdict.task = self._loop.get().create_task(self._read(lane, verdict, triton_name, statistics))
        self._reading.add(task)
        task.add_done_callback(self._reading.discard)

    async def _read(self, lane: _Lane, verdict: Verdict, triton_name: str, statistics: Statistics) -> None:
        """One reading: the lane's verdict updated, and what waits sent at once if merging stopped paying."""
        try:
            stats = await statistics(triton_name)
            changed = verdict.take(stats, self._max_row_ms, lane.active(self._loop.get()), lane.model.instances)
        except Exception as exc:  # Triton restarting, the model unloaded: the verdict stands
            log.debug("statistics of %s not read (%s): merging as decided before", triton_name, exc)
            return
        finally:
            verdict.task = None
        if not changed or lane.verdict is not verdict:
            return
        log.debug(
            "requests to %s %s: Triton executes a row in %.3f ms (SMTRITON_MERGE_MAX_ROW_MS %g)",
            triton_name,
            "merged again" if verdict.pays else "no longer merged",
            verdict.ms,
            self._max_row_ms,
        )
        (self._metrics.merging_resumed if verdict.pays else self._metrics.merging_stopped).inc()
        if not verdict.pays:
            self._send_waiting(lane)

    def _send_waiting(self, lane: _Lane) -> None:
        """Every request waiting in the lane goes at once, alone: merging it no longer pays."""
        while lane.waiting:
            waiting = lane.waiting.popleft()
            if not waiting.answer.done():  # (else its client left)
                lane.sent(self._loop.get())
                waiting.answer.set_result(_SLOT)

    def forget(self, triton_name: str) -> None:
        """The model was loaded or unloaded: its lane goes once nothing is in it (an MME loads many); a
        lane still in use judges the new model afresh."""
        lane = self._lanes.get(triton_name)
        if lane is None:
            return
        if not lane.in_flight and not lane.waiting:
            del self._lanes[triton_name]
            return
        if lane.verdict.task is not None:
            lane.verdict.task.cancel()  # its answer could describe the model as it was
        lane.verdict = Verdict()

    async def close(self) -> None:
        """Stop the merged requests still in flight (their clients are told they were cancelled), and
        the readings of statistics under way."""
        for task in list(self._reading):
            task.cancel()
        for task in list(self._sending):
            task.cancel()
        for task in [*self._reading, *self._sending]:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _given_a_slot(answer: asyncio.Future[Any]) -> bool:
    return answer.done() and not answer.cancelled() and answer.exception() is None and answer.result() is _SLOT


def _next_group(lane: _Lane) -> list[_Waiting]:
    """The first request waiting (whose client is still there), and after it every later one that may
    merge with it, while the rows fit the model's ``max_batch_size``."""
    waiting = lane.waiting
    while waiting and waiting[0].answer.done():
        waiting.popleft()  # its client left
    if not waiting:
        return []
    first = waiting.popleft()
    group = [first]
    rows, size = first.part.batch, first.part.size
    kept: deque[_Waiting] = deque()
    limit = lane.model.max_batch_size
    while waiting:
        item = waiting.popleft()
        if item.answer.done():
            continue
        if rows < limit and item.part.key == first.part.key and merging.fits(rows, size, item.part, limit):
            group.append(item)
            rows += item.part.batch
            size += item.part.size
        else:
            kept.append(item)
    lane.waiting = kept
    return group


async def send_merged(
    send: Callable[[Inference], Awaitable[UpstreamResponse]],
    parts: Sequence[Part],
    model: ModelBatching,
    alone: Callable[[int], Inference],
    again: contextlib.AbstractContextManager[None] | None = None,
) -> list[UpstreamResponse | Exception]:
    """Each of ``parts``' answers (or the error it met), as it would have had it alone: the parts, of one
    key and fitting ``max_batch_size`` together, sent as one Triton request and its answer split back. For
    the requests one body holds at once (its records), which wait for nothing else. Triton refusing the
    merged request as a whole, or its transport failing (once ``send`` has waited out a Triton death and
    sent it again, as it does any stateless request), is each part's own failure, never sent again;
    Triton failing it for a part's rows, or an answer that cannot be split, sends the parts again one at a
    time (``alone(i)``: part ``i``'s own request; inside ``again``), each getting its own answer."""
    try:
        merged = merging.merge(parts)
    except Exception:  # a bug in the merge: the records still go, alone
        log.exception("merging %d records failed; sent alone", len(parts))
        return await _one_by_one(send, len(parts), alone)
    try:
        response = await send(merged.inference)
    except Exception as exc:  # each record's own failure (its own copy: tracebacks differ)
        return [copy.copy(exc) for _ in parts]
    if merging.refused_as_a_whole(response):
        return [response] * len(parts)
    answers = merged.split(response, model)
    if answers is None:
        with again or contextlib.nullcontext():
            return await _one_by_one(send, len(parts), alone)
    return list(answers)


async def _one_by_one(
    send: Callable[[Inference], Awaitable[UpstreamResponse]], count: int, alone: Callable[[int], Inference]
) -> list[UpstreamResponse | Exception]:
    """Each of ``count`` requests sent alone, one after the other (in the place in flight the merged one
    had), each answered or its error kept."""
    results: list[UpstreamResponse | Exception] = []
    for index in range(count):
        try:
            results.append(await send(alone(index)))
        except Exception as exc:
            results.append(exc)
    return results
