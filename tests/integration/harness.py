"""Start the real `serve` (and so the real Triton) on a free loopback port; always stop it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from http.client import HTTPConnection
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families
from urllib3.exceptions import NewConnectionError

from smtriton.local import serve_process
from smtriton.local.serve_process import free_port

__all__ = [
    "ServeProcess",
    "alive",
    "connection_accepted_by",
    "descendants",
    "failing_tritonserver",
    "free_port",
    "metric_samples",
    "no_aws_environment",
    "post_on",
    "triton_has",
    "triton_pids",
    "triton_url",
    "wait_for",
    "worker_pids",
    "workers_that_answered",
]


def no_aws_environment(home: Path) -> dict[str, str]:
    """This environment as on a machine where AWS was never set up: no AWS_* variable, and a home folder
    (``home``, made here) without ~/.aws, so boto3 finds neither a region nor credentials."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return env | {"HOME": str(home), "AWS_EC2_METADATA_DISABLED": "true"}  # no instance role to ask either


def failing_tritonserver(folder: Path) -> Path:
    """A tritonserver in ``folder`` that logs an error and exits 3 at once, beside the real backends
    (so that serve sets it up as it would the real one): for TRITONSERVER in crash-loop tests."""
    from smtriton.serve.triton.installation import find_triton

    binary = folder / "triton" / "bin" / "tritonserver"
    binary.parent.mkdir(parents=True)
    (folder / "triton" / "backends").symlink_to(find_triton().backends, target_is_directory=True)
    binary.write_text("#!/bin/sh\necho 'E0000 00:00:00 1 main.cc] failing on purpose'\nexit 3\n")
    binary.chmod(0o755)
    return binary


def metric_samples(url: str | None) -> dict[tuple[str, tuple], float]:
    """Every sample of a /metrics page, parsed as Prometheus does: (name, sorted labels) -> value."""
    assert url is not None, "this server was started without SMTRITON_METRICS_PORT"
    text = requests.get(url, timeout=5).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


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


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` alive now (its children, theirs, ...)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return sorted(found)


def worker_pids(server: ServeProcess) -> list[int]:
    """The front workers of ``server`` running now: the children of the fork server it started."""
    return serve_process.worker_pids(server.pid)


def workers_that_answered(server: ServeProcess, path: str) -> set[int]:
    """The workers whose access log has a request for ``path``."""
    seen = set()
    for line in server.log_text().splitlines():
        if line.startswith("{") and '"uvicorn.access"' in line and path in line:
            entry = json.loads(line)
            seen.add(entry["worker"])
    return seen


def wait_for(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def connection_accepted_by(server: ServeProcess, pid: int, timeout: float = 30) -> socket.socket:
    """A connection to ``server`` that the worker ``pid`` accepted (the kernel spreads connections over
    the workers by their addresses: new ones are made until that worker takes one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        client = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        port = client.getsockname()[1]
        if wait_for(lambda port=port: _socket_inode(server.port, port) in _socket_inodes(pid), 0.5):
            return client
        client.close()  # queued on another worker's socket
    raise AssertionError(f"worker {pid} took no connection in {timeout} s")


def _socket_inode(server_port: int, client_port: int) -> str:
    """The inode of the server's end of the loopback connection from ``client_port`` (once accepted)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1].rsplit(":", 1)[1], fields[2].rsplit(":", 1)[1]
        if int(local, 16) == server_port and int(remote, 16) == client_port:
            return fields[9]
    return ""


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def post_on(connection: socket.socket, path: str, body: bytes) -> int:
    """POST ``body`` on an open connection; the answer's status."""
    http = HTTPConnection("127.0.0.1")
    http.sock = connection
    http.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    status = http.getresponse().status
    http.close()
    return status


def triton_url(server: ServeProcess) -> str:
    """The loopback HTTP endpoint of ``server``'s Triton (from its command line), as serve reaches it."""
    (pid,) = triton_pids(server.marker)
    for arg in Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0"):
        if arg.startswith("--http-port="):
            return f"http://127.0.0.1:{arg.split('=', 1)[1]}"
    raise AssertionError("Triton has no --http-port")


def triton_key(server: ServeProcess) -> dict[str, str]:
    """The header serve's Triton wants on its restricted APIs (model config, repository), as its command
    line shows it to a process of the same user: what a test reads beside serve."""
    (pid,) = triton_pids(server.marker)
    for arg in Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0"):
        if arg.startswith("--http-restricted-api="):
            name, _, value = arg.rpartition(":")[2].partition("=")
            return {name: value}
    return {}


def triton_has(server: ServeProcess, triton_name: str) -> bool:
    """Whether Triton has loaded ``triton_name`` (asked on its own loopback port, as serve does)."""
    ready = requests.get(f"{triton_url(server)}/v2/models/{triton_name}/ready", timeout=5)
    return ready.status_code == 200


def alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if Path(f"/proc/{pid}").exists()]


class ServeProcess(serve_process.ServeProcess):
    """serve as the tests start it: none of this environment's SageMaker or serve settings, a scratch
    directory of its own next to its log, and a stop that never leaves a Triton behind."""

    def __init__(
        self,
        repository: Path | None,
        default_model: str | None,
        log_path: Path,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        launcher: list[str] | None = None,
    ) -> None:
        self.repository = repository
        # serve's scratch (backend directory, MME repository) goes here, and so it is in Triton's
        # command line: the marker that finds this server's Triton and no other's.
        work_dir = log_path.parent / "work"
        self.marker = str(work_dir)
        serve_args = ["--model-repository", str(repository)] if repository is not None else []
        if default_model:
            serve_args += ["--default-model", default_model]
        serve_args += args or []
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))}
        full_env["SMTRITON_WORK_DIR"] = str(work_dir)
        full_env.update(env or {})
        metrics_port = full_env.get("SMTRITON_METRICS_PORT")
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics" if metrics_port else None
        super().__init__(serve_args, log_path, env=full_env, launcher=launcher or ())

    def stop(self, timeout: float = 60) -> int:
        """serve's own stop, then SIGKILL to any Triton still serving this server's scratch directory."""
        try:
            return super().stop(timeout)
        finally:
            for pid in triton_pids(self.marker):  # never leave a Triton behind, even on failure
                os.kill(pid, signal.SIGKILL)


def refused_before_sending(exc: requests.ConnectionError) -> bool:
    """Whether a request failed because its connection could not be made (nothing was sent), as
    opposed to a connection that was made, took the request and then broke."""
    reason = getattr(exc.args[0] if exc.args else None, "reason", None)
    return isinstance(reason, NewConnectionError)


class ClientsUntilStopped:
    """``count`` clients posting to the ``slow`` test model's ``/invocations`` until stopped, each on a
    new connection, recording "ok" (its own answer, complete), "refused" (the connection could not be
    made, so nothing was sent: allowed while serve shuts down) or "failed: ..." (anything else, a
    request written and then left without an answer included)."""

    def __init__(self, url: str, count: int = 8, second: float = 0.5) -> None:
        self.results: list[str] = []
        self._stop = threading.Event()
        self._url, self._second = f"{url}/invocations", second
        self._threads = [threading.Thread(target=self._client, args=(i,)) for i in range(count)]

    def _client(self, i: int) -> None:
        request = {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [i, self._second]}]}
        body = json.dumps(request)
        while not self._stop.is_set():
            try:
                r = requests.post(self._url, data=body, timeout=30)
            except requests.ConnectionError as exc:
                self.results.append("refused" if refused_before_sending(exc) else f"failed: {exc}")
                time.sleep(0.05)
                continue
            # complete, uncut, this request's own (checked in the test's thread, from what is recorded here)
            answered = r.status_code == 200 and r.json()["outputs"][0]["data"] == [float(i), self._second]
            self.results.append("ok" if answered else f"failed: {r.status_code} {r.text}")

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.ident is not None:  # started
                thread.join(30)

    def failures(self) -> list[str]:
        return [r for r in self.results if r.startswith("failed")]


def status_kib(pid: int, field: str) -> int:
    """A field of /proc/<pid>/status in KiB (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


class Watch:
    """While a block runs: ``/ping`` every ``every_s`` on a connection of its own (``slowest``: the longest
    answer, infinite for a failure), and the one worker's peak resident memory (``grew``: bytes over what
    it held before)."""

    def __init__(self, server: ServeProcess, every_s: float = 0.02) -> None:
        (self.worker,) = worker_pids(server)
        self.server = server
        self.every_s = every_s
        self.pings: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._ping)

    def __enter__(self) -> Watch:
        Path(f"/proc/{self.worker}/clear_refs").write_text("5")  # the peak (VmHWM) starts again from now
        self.before = status_kib(self.worker, "VmRSS") << 10
        self._thread.start()
        return self

    def _ping(self) -> None:
        connection = HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                connection.request("GET", "/ping")
                response = connection.getresponse()
                response.read()
                self.pings.append(time.monotonic() - started if response.status == 200 else float("inf"))
            except OSError:
                self.pings.append(float("inf"))
                connection.close()
            time.sleep(self.every_s)
        connection.close()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        self.grew = (status_kib(self.worker, "VmHWM") << 10) - self.before
        self.slowest = max(self.pings, default=float("inf"))
