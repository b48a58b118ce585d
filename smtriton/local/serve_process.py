"""Run `serve` as a child process on a loopback port: start it, wait until it is healthy, stop it.

The one way anything outside the container launches `serve`: the local SageMaker endpoint, the
integration tests and the benchmark. The child gets its own process group so that stopping it can
end everything it left behind, and a start that fails says why with the tail of the child's log.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from smtriton.serve.triton.ports import LOOPBACK, pick_port

SERVE_MODULE = "smtriton.serve"
START_TIMEOUT_S = 180.0
KILL_WAIT_S = 10.0
LOG_TAIL_CHARS = 4000
PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A free ephemeral loopback port, for a server its caller starts."""
    return pick_port(None, set())


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


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
    point with serve's command line (the benchmark's variants of serve). ``append_log`` keeps what an
    earlier run wrote to ``log_path``. ``die_with_parent`` sends the child SIGTERM when the thread that
    started it exits, so that it never outlives a benchmark run.
    """

    def __init__(
        self,
        args: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        module: str = SERVE_MODULE,
        append_log: bool = False,
        die_with_parent: bool = False,
    ) -> None:
        self.port = port if port is not None else free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.log_path = log_path
        self.command = [sys.executable, "-m", module, "--host", LOOPBACK, "--port", str(self.port), *args]
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

    def wait_healthy(self, timeout: float = START_TIMEOUT_S, *, interval: float = 0.2) -> None:
        """Return once /ping answers 200; raise with the log's tail if the child exits or time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
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
