"""The tritonserver child process: command line, start, log streaming, stop.

Borrowed from PyTriton's server wrapper: the child gets ``PR_SET_PDEATHSIG`` so it never outlives
`serve` (even after a SIGKILL), its output is read line by line into our log, and stopping is a
signal, a bounded wait, then SIGKILL to its whole process group (Python backend stubs included).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from smtriton.serve.settings import Settings
from smtriton.serve.triton.access import TritonAccess
from smtriton.serve.triton.installation import TritonInstallation
from smtriton.serve.triton.ports import LOOPBACK
from smtriton.serve.triton.shm import PREFIX_OPTION

log = logging.getLogger("serve.triton")
triton_log = logging.getLogger("triton")

# Triton's own default --http-thread-count.
TRITON_HTTP_THREADS = 8
_LEVELS = {"I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR, "F": logging.CRITICAL}
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int | None = None
    metrics: int | None = None


def build_command(
    installation: TritonInstallation,
    settings: Settings,
    model_repository: Path,
    backend_dir: Path,
    ports: Ports,
    load_models: Sequence[str] = (),
    shm_prefix: str | None = None,
    access: TritonAccess | None = None,
) -> list[str]:
    """The tritonserver argv: loopback only, explicit model control, SageMaker variables mapped.

    ``load_models`` are loaded by Triton itself as it starts, before it answers as live: the SME model
    loads while the front is still importing its own modules. ``shm_prefix`` names the Python
    backend's shared-memory regions (:mod:`smtriton.serve.triton.shm`); ``access`` puts the APIs that
    load models, show configs and map shared memory behind its header (:mod:`smtriton.serve.triton.access`)."""
    opts = settings.triton
    cmd = [
        str(installation.binary),
        f"--model-repository={model_repository}",
        f"--backend-directory={backend_dir}",
        "--model-control-mode=explicit",
        "--allow-sagemaker=false",
        "--allow-http=true",
        f"--http-address={LOOPBACK}",
        f"--http-port={ports.http}",
        f"--exit-timeout-secs={max(1, int(settings.stop_budget().triton_s))}",
        # serve decides what a failed model means (it exits, saying why, after draining); Triton must not.
        "--exit-on-error=false",
        "--strict-readiness=true",
        f"--log-verbose={opts.log_verbose if opts.log_verbose or settings.log_level != 'debug' else 1}",
        f"--backend-config=python,shm-default-byte-size={opts.shm_default_byte_size}",
        f"--backend-config=python,shm-growth-byte-size={opts.shm_growth_byte_size}",
    ]
    if shm_prefix is not None:
        cmd.append(f"--backend-config=python,{PREFIX_OPTION}{shm_prefix}")
    if access is not None:
        cmd += access.flags()
    if ports.grpc is not None:
        cmd += ["--allow-grpc=true", f"--grpc-address={LOOPBACK}", f"--grpc-port={ports.grpc}"]
    else:
        cmd.append("--allow-grpc=false")
    if ports.metrics is not None:
        cmd += ["--allow-metrics=true", f"--metrics-address={LOOPBACK}", f"--metrics-port={ports.metrics}"]
    else:
        cmd.append("--allow-metrics=false")
    if opts.model_namespacing is not None:
        cmd.append(f"--model-namespacing={str(opts.model_namespacing).lower()}")
    if opts.buffer_manager_thread_count is not None:
        cmd.append(f"--buffer-manager-thread-count={opts.buffer_manager_thread_count}")
    threads = opts.thread_count
    if threads is None and settings.workers > TRITON_HTTP_THREADS:  # one a front worker, as Triton's 8 serve 8
        threads = settings.workers
    if threads is not None:
        cmd.append(f"--http-thread-count={threads}")
    # One log level for both: serve's level sets Triton's unless a SAGEMAKER_TRITON_LOG_* says otherwise.
    level = settings.log_level
    quiet_info = False if level in ("warning", "error") else None
    quiet_warning = False if level == "error" else None
    for flag, value in (
        ("--log-info", opts.log_info if opts.log_info is not None else quiet_info),
        ("--log-warning", opts.log_warning if opts.log_warning is not None else quiet_warning),
        ("--log-error", opts.log_error),
    ):
        if value is not None:
            cmd.append(f"{flag}={str(value).lower()}")
    if opts.tensorflow_version:
        cmd.append(f"--backend-config=tensorflow,version={opts.tensorflow_version}")
    if opts.model_load_gpu_limit is not None:
        cmd += [f"--model-load-gpu-limit={gpu}:{opts.model_load_gpu_limit}" for gpu in _gpu_indices()]
    cmd += [f"--load-model={model}" for model in load_models]
    cmd += list(opts.additional_args)
    return cmd


def _gpu_indices() -> list[int]:
    """GPU indices, as native `serve` counts them with ``nvidia-smi -L`` (none on a CPU host)."""
    visible = os.environ.get("NVIDIA_VISIBLE_DEVICES") or os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible and visible not in ("all", "void", "none"):
        return list(range(len(visible.split(","))))
    dev = Path("/dev")
    return sorted(int(p.name[6:]) for p in dev.glob("nvidia[0-9]*") if p.name[6:].isdigit())


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


# What Triton reports on every host without a GPU, as warnings and errors: expected there, so logged at
# debug level, after one line at info level that says so. Each notice is the parts a line must all hold.
_NO_GPU_NOTICES = (
    ("CudaDriverHelper has not been initialized",),
    ("Unable to allocate pinned system memory, pinned memory pool will not be available",),
    # Every ensemble load asks for a CUDA stream; only the missing driver is expected, not other causes.
    ("unable to create stream for ", "CUDA driver version is insufficient for CUDA runtime version"),
)


def _log_level(line: str) -> int:
    """The logging level of one Triton log line (its first letter: I, W, E or F, then the date)."""
    if not line[1:2].isdigit():
        return logging.INFO
    level = _LEVELS.get(line[:1], logging.INFO)
    if level > logging.INFO and any(all(part in line for part in notice) for notice in _NO_GPU_NOTICES):
        return logging.DEBUG
    return level


_explained: list[bool] = []


def _log_line(raw: bytes) -> str:
    line = raw.decode("utf-8", errors="replace").rstrip()
    level = _log_level(line)
    if level == logging.DEBUG and not _explained:
        _explained.append(True)
        log.info("Triton finds no usable GPU here: its notices about CUDA are expected, and logged at debug level")
    triton_log.log(level, "%s", line)
    return line


class TritonProcess:
    """One running tritonserver. Not restartable: the supervisor makes a new one."""

    def __init__(self, command: list[str], env: dict[str, str], access: TritonAccess | None = None) -> None:
        """``access``: the value in ``command`` that is never logged."""
        self.command = command
        self._access = access
        self._env = {**os.environ, **env}
        self._proc: asyncio.subprocess.Process | None = None
        self._pump: asyncio.Task[None] | None = None
        self.recent_lines: deque[str] = deque(maxlen=50)

    async def spawn(self) -> None:
        shown = " ".join(self.command)
        log.info("starting tritonserver: %s", self._access.hidden(shown) if self._access is not None else shown)
        self._proc = await asyncio.create_subprocess_exec(
            *self.command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self._env,
            start_new_session=True,  # its own process group: stopped as a unit, never by a terminal's ^C
            preexec_fn=_die_with_parent,
        )
        self._pump = asyncio.create_task(self._read_output(), name="triton-log")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc else None

    async def _read_output(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        while True:
            try:
                raw = await self._proc.stdout.readline()
            except ValueError:  # a line longer than the stream limit: skip it, keep reading
                continue
            if not raw:
                return
            self.recent_lines.append(_log_line(raw))

    async def exited(self) -> None:
        """Return as soon as tritonserver itself exits.

        Its Python backend stubs inherit its stdout, so the event loop's own ``wait()`` (which waits
        for the pipes too) would not return while orphaned stubs live on; a pidfd tells at once.
        """
        assert self._proc is not None
        if self._proc.returncode is not None:
            return
        try:
            pidfd = os.pidfd_open(self._proc.pid)
        except (AttributeError, OSError):  # no pidfd (old kernel): fall back to the loop's wait
            await self._proc.wait()
            return
        loop = asyncio.get_running_loop()
        exited = loop.create_future()

        def on_exit() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(pidfd, on_exit)
        try:
            await exited
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)

    async def wait(self) -> int:
        """Wait for tritonserver to exit; then end what it left (stubs) and read its last log lines."""
        assert self._proc is not None
        await self.exited()
        self._kill_group(signal.SIGKILL)
        code = await self._proc.wait()
        if self._pump is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._pump), 2.0)
        return code

    def _kill_group(self, sig: int) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    async def stop(self, timeout: float) -> int | None:
        """SIGTERM (Triton drains and unloads), wait up to ``timeout``, then SIGKILL the whole group."""
        if self._proc is None:
            return None
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.exited(), timeout)
            except asyncio.TimeoutError:
                log.warning("tritonserver did not stop within %.0f s; killing it", timeout)
        # Python backend stubs share the group; none may outlive Triton.
        self._kill_group(signal.SIGKILL)
        code = await self.wait()
        log.info("tritonserver exited with %s", code)
        return code
