"""Front workers: several processes serving the SageMaker port, all in front of the one Triton.

The main process holds the port and supervises the workers (the pre-fork model of gunicorn's arbiter
and uvicorn's ``--workers``: the parent starts the children, replaces one that dies and passes signals
on). Each worker listens on a socket of its own bound with ``SO_REUSEPORT``, so the kernel spreads new
connections over the workers evenly by their addresses; on one socket shared by all, whichever worker
woke first took a burst of connections (4 workers, 64 keep-alive connections: 33, 21, 10 and none,
against 19, 16, 15 and 14 with a socket each; bench/NOTES.md Part 7). Workers are forked from
multiprocessing's fork server, which imports the worker's modules once, while Triton starts: each
worker shares those pages with it instead of importing them again (about 13 MiB of private memory a
worker instead of 50), and a replacement starts in milliseconds. Each worker gets its end of a channel
(:mod:`smtriton.serve.ipc.channel`) and a first message, ``hello``, with the settings and the endpoint's
state; until then it accepts nothing. A worker that exits on its own, even by SIGKILL, is replaced at
once (with back-off if it keeps dying young) while the others keep serving; on shutdown every worker
drains the requests it accepted before the main process stops Triton.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import multiprocessing
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.context import ForkServerProcess

from smtriton.serve.backoff import Backoff
from smtriton.serve.ipc.channel import Channel, ChannelClosed, Handler
from smtriton.serve.ipc.messages import Call, Heartbeat, Hello, Message

log = logging.getLogger("serve.workers")

# A worker that lived this long before dying is replaced at once; one that dies younger, with back-off
# (as a worker that cannot be started at all).
STABLE_RUN_S = 10.0
FIRST_RESTART_S = 0.1
MAX_RESTART_S = 10.0
# A heartbeat goes to each worker this often (at most), and one not answered within the heartbeat
# timeout has its worker killed and replaced.
HEARTBEAT_INTERVAL_S = 1.0
# What a worker runs, as "module:function": function(its index, its end of the channel), which serves
# until it exits. Named, not passed: the fork server imports the module, the main
# process never does.
WORKER_ENTRY = "smtriton.serve.http.worker:run"


@dataclass
class WorkerSlot:
    """One worker's place in the pool: its current process and channel (None between two of them)."""

    index: int
    process: ForkServerProcess | None = None
    channel: Channel | None = None  # set once ``hello`` went out: from then on it hears every change
    started: float = 0.0
    restarts: int = 0
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class WorkerPool:
    """``count`` workers running ``entry``. :meth:`open` gives them the first message and the handler
    of their calls; until then they are started but wait (and accept nothing). A worker that exits is
    replaced; one that does not answer a heartbeat within ``heartbeat_timeout`` seconds (frozen, or its
    event loop stuck) is killed, and so replaced."""

    def __init__(
        self,
        count: int,
        *,
        entry: str = WORKER_ENTRY,
        heartbeat_timeout: float = 10.0,
        on_exit: Callable[[int], None] | None = None,
    ) -> None:
        """``on_exit`` is told the pid of each worker that exited on its own."""
        self.count = count
        self.entry = entry
        self.heartbeat_timeout = heartbeat_timeout
        self._on_exit = on_exit
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload([entry.partition(":")[0], "smtriton.serve.http.preloaded"])
        self.slots = [WorkerSlot(index) for index in range(1, count + 1)]
        self._hello: Callable[[int], Hello] | None = None
        self._handler: Handler | None = None
        self._opened = asyncio.Event()
        self._stopping = False
        self._stopped = False

    def start(self) -> None:
        """Start every worker in the background (the fork server's imports overlap what the caller does)."""
        for slot in self.slots:
            slot.task = asyncio.create_task(self._keep(slot), name=f"worker-{slot.index}")

    def open(self, hello: Callable[[int], Hello], handler: Handler) -> None:
        """The endpoint is assembled: workers get ``hello(index)`` first, then every change."""
        self._hello, self._handler = hello, handler
        self._opened.set()

    @property
    def pids(self) -> list[int]:
        return [slot.process.pid for slot in self.slots if slot.process is not None and slot.process.pid]

    def channels(self) -> list[Channel]:
        return [s.channel for s in self.slots if s.channel is not None and not s.channel.closed.is_set()]

    def notify_all(self, message: Message) -> None:
        for channel in self.channels():
            channel.notify(message)

    async def call_all(self, message: Call[None], timeout: float) -> None:
        """Call every worker and wait for each to answer (a worker that is gone counts as done; one that
        does not answer within ``timeout`` is logged and passed over)."""
        channels = self.channels()
        results = await asyncio.gather(*(c.call(message, timeout) for c in channels), return_exceptions=True)
        for result in results:
            if isinstance(result, asyncio.TimeoutError):
                log.warning("a worker did not answer %r within %.0f s", message.op, timeout)
            elif isinstance(result, BaseException) and not isinstance(result, ChannelClosed):
                raise result

    async def _spawn(self, slot: WorkerSlot) -> tuple[ForkServerProcess, socket.socket]:
        """A new worker process for ``slot``, forked by the fork server (its first start waits for the
        server's imports), and the main process's end of its channel."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        process = self._context.Process(
            target=_run_entry,
            args=(self.entry, slot.index, theirs),
            name=f"worker-{slot.index}",
            daemon=True,
        )
        try:
            await asyncio.to_thread(process.start)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return process, ours

    async def _keep(self, slot: WorkerSlot) -> None:
        """Run the slot's worker; replace it whenever it exits (or could not be started), until the
        pool stops. Nothing here ends the slot but the pool's stop."""
        backoff = Backoff(FIRST_RESTART_S, MAX_RESTART_S, factor=4, stable_s=STABLE_RUN_S)
        while not self._stopping:
            try:
                process, ours = await self._spawn(slot)
            except Exception as exc:  # no descriptors left, no memory to fork...: try again, later
                log.error(
                    "worker %d could not be started: %s; trying again in %.1f s", slot.index, _why(exc), backoff.delay
                )
                await backoff.wait()
                continue
            slot.process, slot.started = process, time.monotonic()
            code = await self._serve(slot, process, ours)
            if self._stopping:
                return
            backoff.after_run(time.monotonic() - slot.started)
            slot.restarts += 1
            pid = process.pid or 0
            log.error(
                "worker %d (pid %d) exited with %s; replacing it in %.1f s", slot.index, pid, _exit(code), backoff.delay
            )
            if self._on_exit is not None:
                self._on_exit(pid)
            await backoff.wait()

    async def _serve(self, slot: WorkerSlot, process: ForkServerProcess, ours: socket.socket) -> int | None:
        """Say hello to a started worker, then keep its channel and its heartbeat until it exits; its
        exit code. A worker that cannot be told hello is killed (and replaced)."""
        tasks: list[asyncio.Task[None]] = []
        try:
            await self._opened.wait()
            assert self._hello is not None and self._handler is not None
            channel = await Channel.open(ours, self._handler)
            channel.notify(self._hello(slot.index))
            slot.channel = channel  # after hello: every later change reaches it, in order
            tasks.append(asyncio.create_task(channel.run(), name=f"worker-{slot.index}-channel"))
            tasks.append(asyncio.create_task(self._beat(slot, process, channel), name=f"worker-{slot.index}-beat"))
        except Exception as exc:
            log.error(
                "worker %d (pid %s) could not be told hello: %s; replacing it", slot.index, process.pid, _why(exc)
            )
            _kill(process)
        try:
            return await _exited(process)
        finally:
            slot.channel = None
            for task in tasks:
                task.cancel()
            ours.close()

    async def _beat(self, slot: WorkerSlot, process: ForkServerProcess, channel: Channel) -> None:
        """Ask the worker for a heartbeat every so often; kill it when one goes unanswered too long (a
        stopped or stuck worker keeps its socket, and the kernel keeps handing it connections)."""
        interval = min(HEARTBEAT_INTERVAL_S, self.heartbeat_timeout / 5)
        while True:
            await asyncio.sleep(interval)
            try:
                await channel.call(Heartbeat(), self.heartbeat_timeout)
            except asyncio.TimeoutError:
                log.error(
                    "worker %d (pid %s) did not answer its heartbeat for %g s; killing it",
                    slot.index,
                    process.pid,
                    self.heartbeat_timeout,
                )
                _kill(process)
                return
            except ChannelClosed:
                return

    async def stop(self, timeout: float) -> None:
        """SIGTERM to every worker (each drains what it accepted), up to ``timeout`` seconds, then SIGKILL;
        once. Never raises for a worker: what failed is logged, so the caller goes on to stop Triton."""
        if self._stopped:
            return
        self._stopped = self._stopping = True
        processes = [s.process for s in self.slots if s.process is not None and s.process.exitcode is None]
        for process in processes:
            with contextlib.suppress(ProcessLookupError, AttributeError):
                process.terminate()
        if processes:
            waits = [asyncio.create_task(_exited(p)) for p in processes]
            _, late = await asyncio.wait(waits, timeout=timeout)
            for process in processes:
                if process.exitcode is None:
                    log.warning("worker pid %s did not drain within %.0f s; killing it", process.pid, timeout)
                    _kill(process)
            if late:
                await asyncio.wait(late, timeout=5)
        for slot in self.slots:
            if slot.task is not None:
                slot.task.cancel()
                try:
                    await slot.task
                except asyncio.CancelledError:
                    pass
                except Exception:
                    log.exception("worker %d's supervision failed", slot.index)
        for process in processes:
            if process.exitcode not in (0, None):
                log.warning("worker pid %s exited with %s", process.pid, _exit(process.exitcode))
        await asyncio.to_thread(_stop_helpers)


def _kill(process: ForkServerProcess) -> None:
    with contextlib.suppress(ProcessLookupError, AttributeError):
        process.kill()


def _why(exc: BaseException) -> str:
    return str(exc) or exc.__class__.__name__


def _stop_helpers() -> None:
    """Stop the fork server and multiprocessing's resource tracker now, once the workers are gone, so
    that no process outlives `serve` (each would otherwise end only after it exits). Their stop is
    the one multiprocessing's own tests use; without it they end a moment later on their own."""
    from multiprocessing import forkserver, resource_tracker

    for helper in (getattr(forkserver, "_forkserver", None), getattr(resource_tracker, "_resource_tracker", None)):
        stop = getattr(helper, "_stop", None)
        if callable(stop):
            with contextlib.suppress(OSError):
                stop()


def _run_entry(entry: str, index: int, channel: socket.socket) -> None:
    """In the worker: run ``entry`` (imported already, by the fork server)."""
    module, _, function = entry.partition(":")
    getattr(importlib.import_module(module), function)(index, channel)


async def _exited(process: ForkServerProcess) -> int | None:
    """Wait until ``process`` has ended (its sentinel becomes readable); its exit code."""
    if process.exitcode is None:
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()
        sentinel = process.sentinel

        def on_end() -> None:
            if not ended.done():
                ended.set_result(None)

        loop.add_reader(sentinel, on_end)
        try:
            await ended
        finally:
            loop.remove_reader(sentinel)
        process.join(0)
    return process.exitcode


def _exit(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"status {code}"
