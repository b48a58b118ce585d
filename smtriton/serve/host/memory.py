"""Giving a large buffer's memory back to the system without holding the event loop.

Freeing a buffer of a gigabyte takes the kernel about a tenth of a second (its pages are released one
by one), and Python frees it with the GIL held: every thread of the process waits, the event loop too.
``madvise(MADV_DONTNEED)`` releases the same pages, and through ctypes it runs with the GIL released, so
done in a thread it costs the loop nothing; the buffer, then holding no pages, is freed at once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap

_MADV_DONTNEED = 4
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


def drop_pages(buffer: bytearray) -> None:
    """Release the whole pages ``buffer`` holds (its contents become zeros): for a buffer no longer read,
    about to be freed. Runs with the GIL released: call it in a thread."""
    if not buffer:
        return
    start = ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer))
    first = -(-start // _PAGE) * _PAGE  # whole pages only: the allocator's header before them stays
    end = (start + len(buffer)) // _PAGE * _PAGE
    for at in range(first, end, _STEP):
        _libc.madvise(at, min(_STEP, end - at), _MADV_DONTNEED)
