"""A front worker's allocator keeping freed memory for the next request, and giving it back at rest
(smtriton/serve/host/memory.py). The allocator's behaviour is measured in fresh interpreters, each
with its own heap: minor page faults and resident memory, as the kernel counts them."""

from __future__ import annotations

import asyncio
import ctypes
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from smtriton.serve.host import memory

MIB = 1 << 20


def _glibc() -> bool:
    return hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


pytestmark = pytest.mark.skipif(not _glibc(), reason="the C library is not glibc")


def _run(script: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=60, check=True
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


# What a worker's heap sees for a 600 KB body that arrives in pieces: the reader's pieces and the
# body, held together while the request lasts, then freed.
_REQUESTS = """
    import json, resource
    from smtriton.serve.host import memory
    kept = memory.keep_freed({keep})

    def request():
        held = [bytearray(256 << 10) for _ in range(4)] + [bytearray(600 << 10)]
        for block in held:
            block[::4096] = b"x" * len(block[::4096])  # every page written, as a body is

    for _ in range(10):
        request()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(40):
        request()
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 40
    print(json.dumps({{"kept": kept, "faults": faults}}))
"""


def test_a_kept_heap_answers_each_request_without_fresh_pages():
    own_policy = _run(_REQUESTS.format(keep=0))
    kept = _run(_REQUESTS.format(keep=64 * MIB))
    assert own_policy["kept"] is False
    assert kept["kept"] is True
    # glibc's own policy hands the heap's top back and faults it in again on every request (about 1.6 MB)
    assert own_policy["faults"] > 100, own_policy
    assert kept["faults"] < 2, kept


_REST = """
    import json, resource
    from smtriton.serve.host import memory

    def resident_mib():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize() / (1 << 20)

    memory.keep_freed(64 << 20)
    start = resident_mib()
    blocks = [bytearray(1 << 20) for _ in range(40)]
    for block in blocks:
        block[::4096] = b"x" * len(block[::4096])
    busy = resident_mib()
    del blocks
    freed = resident_mib()
    memory.give_back_freed()
    print(json.dumps({"start": start, "busy": busy, "freed": freed, "given_back": resident_mib()}))
"""


def test_what_a_worker_keeps_goes_back_when_it_rests():
    sizes = _run(_REST)
    assert sizes["busy"] - sizes["start"] >= 38, sizes
    assert sizes["busy"] - sizes["freed"] < 2, sizes  # freed, and kept for the next requests
    assert sizes["freed"] - sizes["given_back"] >= 38, sizes


def _cpu_clock(steps: Iterator[float]) -> object:
    """A process clock that advances by each of ``steps`` in turn; then the watcher is stopped."""
    now = [0.0]

    def process_time() -> float:
        try:
            now[0] += next(steps)
        except StopIteration:
            raise asyncio.CancelledError from None
        return now[0]

    return process_time


def test_memory_is_given_back_once_per_rest_and_never_while_working(monkeypatch):
    busy, idle = 0.5, 0.001
    # the clock is read once at the start, then once per check (and once more after giving back)
    steps = iter([0, busy, busy, idle, 0, idle, idle, busy, idle, 0, idle])
    given = []
    monkeypatch.setattr(memory.time, "process_time", _cpu_clock(steps))
    monkeypatch.setattr(memory, "give_back_freed", lambda: given.append(True))
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(memory.give_back_when_idle(interval=0))
    assert len(given) == 2


def test_a_worker_that_never_worked_gives_nothing_back(monkeypatch):
    given = []
    monkeypatch.setattr(memory.time, "process_time", _cpu_clock(iter([0.0] * 6)))
    monkeypatch.setattr(memory, "give_back_freed", lambda: given.append(True))
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(memory.give_back_when_idle(interval=0))
    assert given == []


def test_nothing_is_kept_when_the_setting_is_zero():
    assert memory.keep_freed(0) is False


_UNTOUCHED = """
    import asyncio, json, resource, threading
    from smtriton.serve.host import memory

    def resident_mib():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize() / (1 << 20)

    start = resident_mib()
    buffer = memory.untouched(256 << 20)
    made = resident_mib()
    buffer[: 64 << 20] = b"x" * (64 << 20)
    written = resident_mib()
    dropped_in = []
    real = memory.drop_pages

    def drop_pages(view):
        dropped_in.append(threading.current_thread() is threading.main_thread())
        real(view)

    memory.drop_pages = drop_pages

    async def give_back():
        giving = memory.give_back_beside_loop(buffer)
        assert giving is not None
        await giving

    asyncio.run(give_back())
    print(json.dumps({"start": start, "made": made, "written": written, "given_back": resident_mib(),
                      "zeros": buffer[(64 << 20) - 1] == 0, "on_main_thread": dropped_in}))
"""


def test_an_untouched_buffer_holds_only_the_pages_written_and_gives_them_back_beside_the_loop():
    sizes = _run(_UNTOUCHED)
    assert sizes["made"] - sizes["start"] < 2, sizes  # 256 MiB asked for, nothing given yet (no zero fill)
    assert sizes["written"] - sizes["start"] >= 62, sizes
    assert sizes["written"] - sizes["given_back"] >= 62, sizes
    assert sizes["zeros"] is True
    assert sizes["on_main_thread"] == [False]
