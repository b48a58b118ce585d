"""A front worker's memory: kept for the next request while it works, given back when it rests.

Freeing a buffer of a gigabyte takes the kernel about a tenth of a second (its pages are released one
by one), and Python frees it with the GIL held: every thread of the process waits, the event loop too.
``madvise(MADV_DONTNEED)`` releases the same pages, and through ctypes it runs with the GIL released, so
done in a thread it costs the loop nothing; the buffer, then holding no pages, is freed at once.

The other way round, glibc's own policy hands back the top of its heap as soon as more than twice the
largest block it has seen lies free there, and maps blocks past its threshold afresh: a worker that
receives a 600 KB body in pieces gave back and faulted in again about 160 pages (one body's worth)
on every request, 0.7 to 1.0 ms of its CPU (bench/NOTES.md Part 17). :func:`keep_freed` tells it to
keep what is freed, up to a bound, and :func:`give_back_when_idle` hands it back once the worker has
nothing to do.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import mmap
import time
from typing import TypeGuard

_MADV_DONTNEED = 4
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc's ceiling for its mmap threshold on 64-bit hosts: blocks past it are always mapped on their own
# (and given back when freed), whatever is kept.
MMAP_THRESHOLD_MAX = 32 << 20
IDLE_CHECK_S = 2.0
IDLE_CPU_S = 0.01  # CPU a worker may spend in a check's interval and still count as idle
_PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_STEP = 64 << 20  # bytes released in one call


def unused(buffer: bytearray) -> bool:
    """Whether nothing else sees ``buffer`` through a view (its memory may then be dropped)."""
    try:
        buffer.append(0)  # resizing fails while a view of the buffer exists
    except BufferError:
        return False
    buffer.pop()
    return True


def drop_pages(buffer: bytearray | memoryview) -> None:
    """Release the whole pages ``buffer`` holds (its contents become zeros): for a buffer no longer read,
    about to be freed. Runs with the GIL released: call it in a thread."""
    if not buffer:
        return
    start = ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer))
    first = -(-start // _PAGE) * _PAGE  # whole pages only: the allocator's header before them stays
    end = (start + len(buffer)) // _PAGE * _PAGE
    for at in range(first, end, _STEP):
        _libc.madvise(at, min(_STEP, end - at), _MADV_DONTNEED)


def untouched(size: int) -> memoryview:
    """A writable buffer of ``size`` bytes (more than 0) whose pages are given only as they are first
    written: an anonymous mapping, never zero-filled first, never moved or copied as it is written
    (a ``bytearray`` grown to a gigabyte is copied whole whenever its allocator cannot extend it in
    place, and that copy holds the event loop). Give it back with :func:`give_back_beside_loop`: the
    mapping, then holding no pages, is unmapped at once when its last view goes."""
    return memoryview(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE))  # private: its dropped pages are freed


def is_untouched(piece: object) -> TypeGuard[memoryview]:
    """Whether ``piece`` is a buffer :func:`untouched` made."""
    return isinstance(piece, memoryview) and isinstance(piece.obj, mmap.mmap)


def give_back_beside_loop(buffer: memoryview) -> asyncio.Future[None] | None:
    """Release ``buffer``'s pages in the event loop's threads (a gigabyte's take the kernel a tenth of a
    second): for an :func:`untouched` buffer no longer read. Nothing needs to wait for it; None when the
    loop's threads are already shut down (the mapping is then freed whole when its last view goes)."""
    try:
        return asyncio.get_running_loop().run_in_executor(None, drop_pages, buffer)
    except RuntimeError:
        return None


def keep_freed(keep_bytes: int) -> bool:
    """Have this process's allocator take blocks up to :data:`MMAP_THRESHOLD_MAX` from its heap and keep up
    to ``keep_bytes`` freed at the heap's top for the next ones, instead of handing pages back and
    faulting them in again on every request; False where the C library is not glibc (or ``keep_bytes``
    is 0: its own policy stays)."""
    mallopt = getattr(_libc, "mallopt", None)
    if keep_bytes <= 0 or mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(_M_TRIM_THRESHOLD, keep_bytes))


def give_back_freed() -> None:
    """Hand every whole free page of the heap back to the system (``malloc_trim``)."""
    trim = getattr(_libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


async def give_back_when_idle(interval: float = IDLE_CHECK_S) -> None:
    """Once per stretch of rest, give what the allocator keeps back: when an ``interval`` passed in which
    this process spent under :data:`IDLE_CPU_S` of CPU after it had worked. Runs until cancelled."""
    used = time.process_time()
    worked = False
    while True:
        await asyncio.sleep(interval)
        now = time.process_time()
        if now - used >= IDLE_CPU_S:
            worked = True
        elif worked:
            give_back_freed()
            worked = False
            now = time.process_time()
        used = now
