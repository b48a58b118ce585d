"""The main process as its own tree's init: orphans it adopts are reaped, its own children are not.

In the container `serve` is PID 1, and the kernel hands PID 1 every orphan: when Triton dies, the
Python backend stubs it started (killed with its process group) become `serve`'s children, and each
stays a zombie, holding a pid of the container's limit, until its parent waits for it. `serve` also
marks itself a child subreaper, so that its tree's orphans come to it wherever it runs, PID 1 or not.

Which zombies to reap without taking the exit status of a child that someone else waits for (the
supervisor waits for Triton, multiprocessing for its fork server and resource tracker, subprocess for
its commands): `serve` starts each child of its own either in its own session or as the leader of a
session of its own (Triton, ``start_new_session``). A zombie child in another session that does not
lead it was started by someone else, and reached `serve` only as an orphan: Triton's stubs are in
Triton's session. Those are reaped, one pid at a time, never with a ``waitpid(-1)``; which children are
zombies is read from ``/proc``, and only once ``waitid`` (without reaping) says there is one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import time
from pathlib import Path

log = logging.getLogger("serve")

PR_SET_CHILD_SUBREAPER = 36
REAP_INTERVAL_S = 1.0
LAST_ORPHANS_S = 1.0  # the longest serve's exit waits for orphans still dying


def become_subreaper() -> bool:
    """Have the kernel hand this process the orphans of its descendants (as it does PID 1's); False
    where it refuses."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log.warning("cannot become a child subreaper (%s): orphans go to PID 1", os.strerror(ctypes.get_errno()))
        return False
    return True


def _a_child_is_a_zombie() -> bool:
    """Whether some child has exited and was not waited for yet (it stays so: nothing is reaped here)."""
    try:
        return os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # no child at all
        return False


def _adopted(proc: Path = Path("/proc")) -> dict[int, str]:
    """This process's children in a session neither its own nor led by themselves, with their state
    (``Z``: a zombie)."""
    me, session = os.getpid(), os.getsid(0)
    found = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # after the command's closing parenthesis: state, parent, process group, session, ...
        state, parent, _, their_session = stat[stat.rindex(")") + 2 :].split()[:4]
        pid = int(entry.name)
        if int(parent) == me and int(their_session) not in (session, pid):
            found[pid] = state
    return found


def reap_orphans() -> list[int]:
    """Reap every orphan this process adopted that is a zombie now; their pids."""
    if not _a_child_is_a_zombie():
        return []
    reaped = []
    for pid, state in _adopted().items():
        if state == "Z":
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    reaped.append(pid)
    if reaped:
        log.info("reaped %d orphaned process(es) left by a dead parent: %s", len(reaped), ", ".join(map(str, reaped)))
    return reaped


async def reap_forever(interval: float = REAP_INTERVAL_S) -> None:
    """Reap adopted orphans every ``interval`` seconds (a signal handler for SIGCHLD would take the
    signal from the event loop's own child watching)."""
    while True:
        await asyncio.sleep(interval)
        reap_orphans()


async def reap_the_last(timeout: float = LAST_ORPHANS_S) -> None:
    """On the way out, once Triton's process group was killed: wait up to ``timeout`` seconds for the
    orphans still dying (stubs that outlived a stopping Triton) and reap them, so that none outlives
    `serve` for another process to reap."""
    deadline = time.monotonic() + timeout
    while True:
        reap_orphans()
        if not _adopted() or time.monotonic() >= deadline:
            return
        await asyncio.sleep(0.01)
