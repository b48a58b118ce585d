"""How long the event loop went without a turn while a piece of work ran beside it: the tests of work
done in slices (large JSON, records, CSV rows) hold the gaps to a bound."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def gaps_while(work: Awaitable[T]) -> tuple[T, list[float]]:
    """``work``'s result, and the time between one turn of the loop and the next while it ran."""
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticking = asyncio.ensure_future(ticker())
    try:
        return await work, gaps
    finally:
        ticking.cancel()
