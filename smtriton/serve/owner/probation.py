"""One request on probation at a time, endpoint-wide: how a request that kills Triton is told apart.

When Triton dies, the requests in flight on it are sent again once it is back (docs/design.md §7): one
of them may be what killed it, and it must not crash Triton in a loop. Each such request is sent again
*on probation*: the workers ask here, once a Triton serves again, and only one of them, anywhere on the
endpoint, runs at a time. A request whose Triton dies again while it runs on probation was in flight at
both deaths with nothing else under suspicion: it is answered 5xx and never sent a third time. Other
requests keep flowing; only the suspects wait their turn, in the order they asked.

A turn is named by its worker (the process id) and that worker's own count, so the worker can give it
back whether it came or not: a request that no longer waits (its client left, its timeout passed) leaves
the line at once, and every turn of a worker that died goes with it. A turn that runs lapses after the
lease, a last resort for a request that outruns it or a notice that never came.
"""

from __future__ import annotations

import asyncio
import functools
import logging

log = logging.getLogger("serve")

LEASE_S = 30.0

Turn = tuple[int, int]  # (the worker's process id, the worker's count of its turns)


class ProbationDesk:
    def __init__(self, lease_s: float = LEASE_S) -> None:
        self._lease_s = lease_s
        self._line: dict[Turn, asyncio.Future[bool]] = {}  # the turns that wait, in the order they asked
        self._holder: Turn | None = None
        self._lapse: asyncio.TimerHandle | None = None

    def grant(self, turn: Turn) -> asyncio.Future[bool]:
        """``turn``, in line from now (taken at once, so that a :meth:`release` that follows finds it):
        the future is True once it runs alone on probation, its lease counted from then; False when it
        was given back before it came. Cancelling the future gives the turn back."""
        granted: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self._holder is None and not self._line:
            self._hold(turn)
            granted.set_result(True)
            return granted
        self._line[turn] = granted
        granted.add_done_callback(functools.partial(self._cancelled, turn))
        return granted

    def release(self, turn: Turn) -> None:
        """``turn`` is over, or no longer wanted: a waiting one leaves the line, a running one lets the
        next go. A turn already over (lapsed, or given back) changes nothing."""
        waiting = self._line.pop(turn, None)
        if waiting is not None:
            if not waiting.done():
                waiting.set_result(False)
            return
        if turn != self._holder:
            return
        self._holder = None
        if self._lapse is not None:
            self._lapse.cancel()
            self._lapse = None
        self._next()

    def forget(self, worker: int) -> None:
        """The worker with that process id died: its turns, waiting or running, go back."""
        for turn in [turn for turn in self._line if turn[0] == worker]:
            self.release(turn)
        if self._holder is not None and self._holder[0] == worker:
            self.release(self._holder)

    @property
    def holder(self) -> Turn | None:
        """The turn running on probation now."""
        return self._holder

    @property
    def waiting(self) -> int:
        """How many turns wait in line."""
        return len(self._line)

    def _cancelled(self, turn: Turn, granted: asyncio.Future[bool]) -> None:
        if granted.cancelled() and self._line.get(turn) is granted:
            del self._line[turn]

    def _next(self) -> None:
        while self._line:
            turn = next(iter(self._line))
            granted = self._line.pop(turn)
            if not granted.done():
                self._hold(turn)
                granted.set_result(True)
                return

    def _hold(self, turn: Turn) -> None:
        self._holder = turn
        self._lapse = asyncio.get_running_loop().call_later(self._lease_s, self._lapsed, turn)

    def _lapsed(self, turn: Turn) -> None:
        if turn == self._holder:
            log.warning("a request on probation held its turn for %.0f s: the next one goes", self._lease_s)
            self._lapse = None
            self.release(turn)
