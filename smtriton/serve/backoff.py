"""The wait before trying again: Triton's restarts and failed starts, a worker's replacement.

One rule for every retry loop in `serve`: the first wait, then each wait ``factor`` times the last up
to a ceiling, and the first again once what failed had run long enough to count as a new failure
rather than the same one repeating.
"""

from __future__ import annotations

import asyncio


class Backoff:
    """Waits of ``first`` seconds, multiplied by ``factor`` after each up to ``maximum``; back to
    ``first`` once something ran ``stable_s`` seconds before it failed."""

    def __init__(self, first: float, maximum: float, *, factor: float = 2.0, stable_s: float) -> None:
        self.first = first
        self.maximum = maximum
        self.factor = factor
        self.stable_s = stable_s
        self.delay = first

    def after_run(self, seconds: float) -> bool:
        """What failed had run ``seconds``: whether that was long enough to start from the first wait."""
        if seconds > self.stable_s:
            self.delay = self.first
            return True
        return False

    async def wait(self) -> None:
        """Sleep the current delay, then lengthen the next one."""
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * self.factor, self.maximum)
