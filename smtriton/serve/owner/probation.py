"""One request on probation at a time, endpoint-wide: how a request that kills Triton is told apart.

When Triton dies, the requests in flight on it are sent again once it is back (docs/design.md §7): one
of them may be what killed it, and it must not crash Triton in a loop. Each such request is sent again
*on probation*: the workers ask here, and only one of them, anywhere on the endpoint, runs at a time.
A request whose Triton dies again while it runs on probation was in flight at both deaths with nothing
else under suspicion: it is answered 5xx and never sent a third time. Other requests keep flowing; only
the suspects wait their turn. A grant lapses after :data:`LEASE_S` seconds, so a worker that died
holding one cannot stop the others.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

log = logging.getLogger("serve")

LEASE_S = 30.0


class ProbationDesk:
    def __init__(self, lease_s: float = LEASE_S) -> None:
        self._lease_s = lease_s
        self._lock = asyncio.Lock()
        self._tokens = itertools.count(1)
        self._holder: int | None = None
        self._lapse: asyncio.TimerHandle | None = None

    async def grant(self) -> int:
        """A token, once no other request runs on probation (a lapsed grant counts as over)."""
        await self._lock.acquire()
        token = next(self._tokens)
        self._holder = token
        self._lapse = asyncio.get_running_loop().call_later(self._lease_s, self._lapsed, token)
        return token

    def release(self, token: int) -> None:
        """The request with ``token`` is over; a stale token (lapsed, or released) changes nothing."""
        if token != self._holder:
            return
        self._holder = None
        if self._lapse is not None:
            self._lapse.cancel()
            self._lapse = None
        self._lock.release()

    def _lapsed(self, token: int) -> None:
        if token == self._holder:
            log.warning("a request on probation held its turn for %.0f s: the next one goes", self._lease_s)
            self._lapse = None
            self.release(token)
