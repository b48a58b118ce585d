"""An object that serves one event loop asks asyncio for it once."""

from __future__ import annotations

import asyncio

import pytest

from smtriton.serve import eventloop
from smtriton.serve.eventloop import LoopOfFirstUse


def test_the_loop_of_first_use_is_the_running_loop_asked_for_once(monkeypatch):
    asked: list[asyncio.AbstractEventLoop] = []
    real = asyncio.get_running_loop

    def counted() -> asyncio.AbstractEventLoop:
        asked.append(real())
        return asked[-1]

    async def main() -> None:
        kept = LoopOfFirstUse()
        monkeypatch.setattr(asyncio, "get_running_loop", counted)
        loops = [kept.get() for _ in range(3)]
        monkeypatch.undo()
        assert loops == [real()] * 3
        assert len(asked) == 1

    eventloop.run(main())


def test_the_loop_of_first_use_needs_a_running_loop():
    with pytest.raises(RuntimeError):
        LoopOfFirstUse().get()
