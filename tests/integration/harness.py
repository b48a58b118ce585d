"""Start the real `serve` (and so the real Triton) on a free loopback port; always stop it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

START_TIMEOUT_S = 180


def metric_samples(url: str | None) -> dict[tuple[str, tuple], float]:
    """Every sample of a /metrics page, parsed as Prometheus does: (name, sorted labels) -> value."""
    assert url is not None, "this server was started without SMTRITON_METRICS_PORT"
    text = requests.get(url, timeout=5).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def triton_pids(marker: str) -> list[int]:
    """PIDs of tritonserver processes whose command line mentions ``marker`` (a unique path)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and cmdline[0].endswith(b"tritonserver") and any(marker.encode() in a for a in cmdline):
            pids.append(int(entry.name))
    return pids


class ServeProcess:
    """One `serve` child process speaking HTTP on 127.0.0.1:<port>."""

    def __init__(
        self,
        repository: Path | None,
        default_model: str | None,
        log_path: Path,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
    ) -> None:
        self.repository = repository
        # serve's scratch (backend directory, MME repository) goes here, and so it is in Triton's
        # command line: the marker that finds this server's Triton and no other's.
        work_dir = log_path.parent / "work"
        self.marker = str(work_dir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [sys.executable, "-m", "smtriton.serve", "--host", "127.0.0.1", "--port", str(self.port)]
        if repository is not None:
            cmd += ["--model-repository", str(repository)]
        if default_model:
            cmd += ["--default-model", default_model]
        cmd += args or []
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))}
        full_env["SMTRITON_WORK_DIR"] = str(work_dir)
        full_env.update(env or {})
        metrics_port = full_env.get("SMTRITON_METRICS_PORT")
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics" if metrics_port else None
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
        )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_healthy(self, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}")
            try:
                if requests.get(f"{self.url}/ping", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"serve not healthy within {timeout} s:\n{self.log_text()[-4000:]}")

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, bounded wait, then SIGKILL of the whole group; returns serve's exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        for pid in triton_pids(self.marker):  # never leave a Triton behind, even on failure
            os.kill(pid, signal.SIGKILL)
        self._log.close()
        return self.proc.returncode
