"""Run `serve` on a loopback port, as a child process or in the serving image: start, wait healthy, stop.

The one way anything outside the container launches `serve`: the local SageMaker endpoint, the
integration and image tests and the benchmark. ``ServeProcess`` runs it from this environment in its own
process group, so that stopping it can end everything it left behind; ``ServeContainer`` runs the image
with docker or podman as SageMaker does (``IMAGE serve``). A start that fails says why with the tail of
the log.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from smtriton.serve.triton.ports import LOOPBACK, pick_port

SERVE_MODULE = "smtriton.serve"
START_TIMEOUT_S = 180.0
KILL_WAIT_S = 10.0
LOG_TAIL_CHARS = 4000
PR_SET_PDEATHSIG = 1
# Triton's Python backend takes 16 MiB of /dev/shm per model instance at first; the engines' default of
# 64 MiB holds four. SageMaker's instances give far more.
SHM_SIZE = "1g"


def free_port() -> int:
    """A free ephemeral loopback port, for a server its caller starts."""
    return pick_port(None, set())


def worker_pids(serve_pid: int) -> list[int]:
    """The front workers of the serve of ``serve_pid`` running now: the children of the fork server it
    started (read from /proc)."""
    children: dict[int, list[int]] = {}
    commands: dict[int, bytes] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            commands[int(entry.name)] = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry.name))
    servers = [p for p in children.get(serve_pid, []) if b"multiprocessing.forkserver" in commands.get(p, b"")]
    return sorted(pid for fork_server in servers for pid in children.get(fork_server, []))


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def load_failure(models: Sequence[str]) -> re.Pattern[str]:
    """Triton's log message for one of ``models`` that it could not load, ``failed to load 'NAME'
    version 1: <reason>``, up to the first escaped line break or quote (serve logs text or JSON lines)."""
    names = "|".join(re.escape(m) for m in models)
    return re.compile(rf"failed to load '(?:{names})'[^\\\"\n]*")


def _ping_status(port: int, timeout: float) -> int | None:
    """GET /ping on loopback; None while nothing answers (not listening yet, or mid-start)."""
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout)
    try:
        conn.request("GET", "/ping")
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


class ServeProcess:
    """One `serve` child on ``127.0.0.1:<port>``, started on construction; always end it with ``stop``.

    ``env`` is the child's whole environment (default: this process's). ``module`` runs another entry
    point with serve's command line (the benchmark's variants of serve). ``launcher`` is a command that
    runs serve's (its arguments follow), to start it somewhere else: another cgroup, a private mount
    namespace. ``append_log`` keeps what an earlier run wrote to ``log_path``. ``die_with_parent`` sends
    the child SIGTERM when the thread that started it exits, so that it never outlives a benchmark run.
    """

    def __init__(
        self,
        args: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        module: str = SERVE_MODULE,
        launcher: Sequence[str] = (),
        append_log: bool = False,
        die_with_parent: bool = False,
    ) -> None:
        self.port = port if port is not None else free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.log_path = log_path
        serve = [sys.executable, "-m", module, "--host", LOOPBACK, "--port", str(self.port), *args]
        self.command = [*launcher, *serve]
        self._log = log_path.open("ab" if append_log else "wb")
        try:
            self._proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=True,  # its own group: stop() can kill all it left behind
                preexec_fn=_die_with_parent if die_with_parent else None,
            )
        except BaseException:
            self._log.close()
            raise

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once the child has exited and was waited for; None before."""
        return self._proc.returncode

    def poll(self) -> int | None:
        return self._proc.poll()

    def wait(self, timeout: float) -> int:
        """The exit status; raises ``subprocess.TimeoutExpired`` if it is still running after ``timeout``."""
        return self._proc.wait(timeout)

    def send_signal(self, sig: int) -> None:
        self._proc.send_signal(sig)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        return self.log_text()[-chars:]

    def wait_healthy(
        self, timeout: float = START_TIMEOUT_S, *, interval: float = 0.2, models: Sequence[str] = ()
    ) -> None:
        """Return once /ping answers 200; raise with the log's tail if the child exits or time runs out,
        and with Triton's reason when one of ``models`` failed to load (a single-model serve then exits;
        a multi-model one stays up)."""
        failure = load_failure(models) if models else None
        deadline = time.monotonic() + timeout
        while True:
            exited = self._proc.poll() is not None
            if failure is not None and (found := failure.search(self.log_text())):
                raise RuntimeError(f"Triton {found.group(0)}")
            if exited:
                raise RuntimeError(f"serve exited with {self._proc.returncode}:\n{self.log_tail()}")
            if _ping_status(self.port, timeout=2.0) == 200:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"serve not healthy within {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(interval)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (serve drains and stops its Triton), a bounded wait, then SIGKILL to the whole group.

        Returns serve's exit status (negative: the signal that ended it)."""
        code = self._proc.poll()
        if code is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                code = self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._proc.pid, signal.SIGKILL)
                code = self._proc.wait(KILL_WAIT_S)
        self._log.close()
        return code


def container_engine(engine: str | None = None) -> list[str]:
    """The container command: ``engine`` or $SMTRITON_CONTAINER_ENGINE (split like a shell would, e.g.
    ``podman --runtime runc``), else docker where its daemon answers, else podman."""
    chosen = engine or os.environ.get("SMTRITON_CONTAINER_ENGINE")
    if chosen:
        return shlex.split(chosen)
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False)
        if probe.returncode == 0:
            return ["docker"]
    if shutil.which("podman"):
        return ["podman"]
    raise RuntimeError("no container engine: install docker (with a running daemon) or podman")


@dataclass(frozen=True)
class Mount:
    """A host path bind-mounted into the container."""

    source: Path
    target: str
    read_only: bool = True

    def arg(self) -> str:
        return f"type=bind,source={self.source.resolve()},target={self.target}" + (",ro" if self.read_only else "")


class ServeContainer(ServeProcess):
    """The serving image run as SageMaker runs it (``IMAGE serve``), reached on ``127.0.0.1:<port>``.

    Same interface as ``ServeProcess``: the child is the engine's foreground ``run`` (its output is the
    container's log), and ``stop`` is the engine's ``stop``, which sends the image's STOPSIGNAL (SIGTERM)
    and after ``timeout`` kills it. ``env`` is only what the container gets (the image sets the rest);
    ``user`` runs it as another user, ``read_only`` with a read-only root filesystem (scratch on a tmpfs
    /tmp); ``shm_size`` sizes /dev/shm. The container shares the host's network and listens on loopback only.
    """

    def __init__(
        self,
        image: str,
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        mounts: Sequence[Mount] = (),
        port: int | None = None,
        engine: str | None = None,
        user: str | None = None,
        read_only: bool = False,
        shm_size: str = SHM_SIZE,
        append_log: bool = False,
    ) -> None:
        self.port = port if port is not None else free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.log_path = log_path
        self.engine = container_engine(engine)
        self.name = f"smtriton-serve-{uuid.uuid4().hex[:12]}"
        run = [*self.engine, "run", "--rm", "--name", self.name, "--network", "host", "--stop-timeout", "60"]
        run += ["--shm-size", shm_size, "--env", f"SAGEMAKER_BIND_TO_PORT={self.port}"]
        for key, value in (env or {}).items():
            run += ["--env", f"{key}={value}"]
        for mount in mounts:
            run += ["--mount", mount.arg()]
        if user is not None:
            run += ["--user", user]
        if read_only:
            run += ["--read-only", "--tmpfs", "/tmp:rw,exec,mode=1777"]
        # Loopback only: the host's network is shared, and nothing outside this machine should reach it.
        self.command = [*run, image, "serve", "--host", LOOPBACK]
        self._log = log_path.open("ab" if append_log else "wb")
        try:
            self._proc = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
            )
        except BaseException:
            self._log.close()
            raise

    def send_signal(self, sig: int) -> None:
        """Signal serve inside the container (the engine's own process would not pass it on)."""
        self._engine("kill", "--signal", str(int(sig)), self.name)

    def _engine(self, *args: str, timeout: float = 30.0) -> int:
        try:
            done = subprocess.run([*self.engine, *args], capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return -1
        return done.returncode

    def stop(self, timeout: float = 60.0) -> int:
        """``ENGINE stop`` (SIGTERM: serve drains and stops its Triton; SIGKILL after ``timeout``), then the
        exit status of ``ENGINE run``, which is the container's."""
        code = self._proc.poll()
        if code is None:
            self._engine("stop", "--time", str(round(timeout)), self.name, timeout=timeout + 30)
            try:
                code = self._proc.wait(KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                self._engine("rm", "--force", self.name)
                self._proc.kill()
                code = self._proc.wait(KILL_WAIT_S)
        self._log.close()
        return code
