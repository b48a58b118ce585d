"""The three servers under test, started one at a time on loopback ports, always stopped.

- ``anchor``: tritonserver's own C++ SageMaker front end (``--allow-sagemaker=true``).
- ``ours``: ``serve`` (FastAPI front + embedded loopback Triton), with its default number of front
  workers; ``ours-w<N>``: the same with N front workers (``SAGEMAKER_MODEL_SERVER_WORKERS``);
  ``ours-unmerged``: the same with every request sent alone (``SMTRITON_MERGE_REQUESTS=false``), the
  A/B of merging requests in one run; ``ours@<rev>``: ``serve`` as the git revision ``<rev>`` has it (its
  ``smtriton/`` exported beside the logs), for an A/B of two commits in one run.
- ``proxy``: the hand-written FastAPI + tritonclient proxy (``bench/proxy_app.py``) in front of a
  loopback Triton.

All three run the same binary, backend directory and environment (``find_triton`` +
``assemble_backends``, as ``serve`` does) and the same Triton argv (``build_command``): only the front
differs, except that the anchor's Triton also listens for HTTP on a loopback port, idle but for the
statistics the benchmark reads between runs (``triton_stats``). Every process gets
``PR_SET_PDEATHSIG`` so nothing outlives the benchmark, and ``stop`` kills the whole tree (Triton's
Python backend stubs included).
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from smtriton.local.serve_process import ServeProcess, free_port
from smtriton.serve.settings import Settings
from smtriton.serve.triton.backends import assemble_backends
from smtriton.serve.triton.installation import TritonInstallation, find_triton
from smtriton.serve.triton.process import Ports, build_command

LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 180.0
CLK_TCK = os.sysconf("SC_CLK_TCK")
PROXY = ("uvicorn", "bench.proxy_app:app", 1)
KINDS = ("anchor", "ours", "proxy")  # and ours-w<N>: serve with N front workers; ours-unmerged; ours@<rev>
UNMERGED = "ours-unmerged"  # serve with SMTRITON_MERGE_REQUESTS=false
REPO_ROOT = Path(__file__).resolve().parent.parent


def ours_workers(kind: str) -> int | None:
    """N for ``ours-w<N>``; None for any other server."""
    count = kind.removeprefix("ours-w")
    return int(count) if kind.startswith("ours-w") and count.isdigit() and int(count) > 0 else None


def ours_revision(kind: str) -> str | None:
    """<rev> for ``ours@<rev>``; None for any other server."""
    revision = kind.partition("@")[2]
    return revision if kind.startswith("ours@") and revision else None


def known(kind: str) -> bool:
    return kind in KINDS or kind == UNMERGED or ours_workers(kind) is not None or ours_revision(kind) is not None


def first_on_path(source: Path, env: dict[str, str]) -> str:
    """``PYTHONPATH`` with ``source`` (a revision's ``smtriton/``) first and what ``env`` had on it after
    (packages put there by hand stay seen)."""
    return os.pathsep.join(filter(None, (str(source), env.get("PYTHONPATH"))))


def export_revision(revision: str, into: Path) -> Path:
    """``smtriton/`` as ``revision`` has it, exported under ``into`` (once per run); a directory to put
    first on ``PYTHONPATH``."""
    if sys.version_info < (3, 11):
        raise RuntimeError("ours@<rev> needs Python 3.11 or later (PYTHONSAFEPATH)")
    tree = into / f"source-{revision}"
    if not tree.exists():
        staging = into / f"source-{revision}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "archive", "--format=tar", revision, "smtriton"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(staging)], input=archive, check=True)
        staging.rename(tree)
    return tree


def _die_with_parent(sig: int) -> None:  # pragma: no cover - runs between fork and exec
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG


# ----- /proc accounting ------------------------------------------------------------------------
def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2 :].split()  # fields from 3 (state) on; comm may hold spaces


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): tells a process from a later one with its pid."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants (by parent pid), alive now."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """utime + stime of each pid (all its threads), in seconds; vanished pids are left out."""
    out = {}
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            out[pid] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def memory_kib(pid: int) -> dict[str, int]:
    """Resident memory of ``pid`` in KiB: ``rss``, ``pss`` (shared pages split between their users) and
    ``private`` (pages no other process maps: what one more such process costs)."""
    fields: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, value = line.partition(":")
            if value.strip().endswith("kB"):
                fields[key] = int(value.split()[0])
    except OSError:
        return {}
    return {
        "rss": fields.get("Rss", 0),
        "pss": fields.get("Pss", 0),
        "private": fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0),
    }


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (everything but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = values[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def loadavg() -> tuple[float, float, float]:
    one, five, fifteen = Path("/proc/loadavg").read_text().split()[:3]
    return float(one), float(five), float(fifteen)


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


# ----- HTTP probes (stdlib: no client library in the measurement path) --------------------------
def http_status(port: int, method: str, path: str, timeout: float = 2.0) -> int | None:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except OSError:
        return None
    finally:
        conn.close()


def triton_http_port(pids: list[int]) -> int | None:
    """The loopback HTTP port on the command line of one of Triton's ``pids`` (serve starts it so)."""
    for pid in pids:
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        for arg in args:
            if arg.startswith("--http-port="):
                return int(arg.split("=", 1)[1])
    return None


def triton_stats(port: int, model: str) -> dict[str, int] | None:
    """Triton's statistics of ``model`` so far (every version summed): requests it answered, inferences
    (rows) and executions; None when Triton does not answer them."""
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=5)
    try:
        conn.request("GET", f"/v2/models/{model}/stats")
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            return None
    except OSError:
        return None
    finally:
        conn.close()
    totals = {"requests": 0, "inferences": 0, "executions": 0}
    for stats in json.loads(body).get("model_stats", []):
        totals["requests"] += int(stats["inference_stats"]["success"]["count"])
        totals["inferences"] += int(stats["inference_count"])
        totals["executions"] += int(stats["execution_count"])
    return totals


def post(port: int, path: str, body: bytes, content_type: str, timeout: float = 60.0) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": content_type})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type", ""), resp.read()
    finally:
        conn.close()


# ----- the Triton every server runs ------------------------------------------------------------
@dataclass(frozen=True)
class TritonSetup:
    installation: TritonInstallation
    backend_dir: Path

    @classmethod
    def create(cls, work_dir: Path) -> TritonSetup:
        explicit = os.environ.get("TRITONSERVER")
        installation = find_triton(Path(explicit) if explicit else None)
        return cls(installation, assemble_backends(installation, work_dir / "backends"))

    @property
    def env(self) -> dict[str, str]:
        return {**_clean_env(), **self.installation.env}

    def command(self, repository: Path, model: str | None, http_port: int) -> list[str]:
        """serve's own Triton argv (loopback HTTP, explicit control), with the model loaded at start."""
        cmd = build_command(self.installation, Settings(), repository, self.backend_dir, Ports(http=http_port))
        return [*cmd, f"--load-model={model}"] if model else cmd

    def sagemaker_command(
        self, repository: Path, model: str | None, sagemaker_port: int, stats_port: int | None = None
    ) -> list[str]:
        """The same argv with Triton's SageMaker front end instead of its HTTP one (native serve's flags);
        ``model`` None: a multi-model endpoint (nothing loaded at start, models namespaced per url).
        ``stats_port``: Triton's HTTP endpoint stays on, on this loopback port, for its statistics."""
        cmd = []
        for arg in self.command(repository, model, stats_port or 0):
            if stats_port is None and arg.startswith(("--http-address=", "--http-port=")):
                continue
            switch = {"--allow-sagemaker=false": "--allow-sagemaker=true"}
            if stats_port is None:
                switch["--allow-http=true"] = "--allow-http=false"
            cmd.append(switch.get(arg, arg))
        namespacing = [] if model is not None else ["--model-namespacing=true"]
        return [*cmd, *namespacing, f"--sagemaker-port={sagemaker_port}"]

    def anchor(
        self, repository: Path, model: str, sagemaker_port: int, stats_port: int
    ) -> tuple[list[str], dict[str, str]]:
        """The anchor serving ``model`` alone: its argv and environment."""
        env = {**self.env, "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": model}
        return self.sagemaker_command(repository, model, sagemaker_port, stats_port), env


def _clean_env() -> dict[str, str]:
    """This environment without any SageMaker or serve setting that could change a server's behaviour."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_", "BENCH_"))}


# ----- one server ------------------------------------------------------------------------------
class Server:
    """One server under test; ``start`` returns launch → ``/ping`` 200 in seconds."""

    def __init__(
        self,
        kind: str,
        setup: TritonSetup,
        repository: Path,
        model: str,
        log_dir: Path,
        mme: bool = False,
        serve_env: dict[str, str] | None = None,
    ) -> None:
        """``mme``: a multi-model endpoint (anchor or ours only) whose models are loaded from under
        ``repository`` (the model root) with ``POST /models``; ``model`` is then only a label.
        ``serve_env``: settings of serve (ours and its variants only)."""
        if not known(kind):
            raise ValueError(f"unknown server {kind!r}: {', '.join(KINDS)}, ours-w<N> or ours@<rev>")
        if mme and kind not in ("anchor", "ours"):
            raise ValueError(f"{kind}: only anchor and ours serve multi-model endpoints")
        self.mme = mme
        self.kind = kind
        self.serve_env = serve_env or {}
        self.setup = setup
        self.repository = repository.resolve()
        self.model = model
        self.log_dir = log_dir
        self.port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []  # Triton and the front, for anchor and proxy
        self.serve: ServeProcess | None = None  # for ours and serve's variants
        self._triton_port: int | None = None  # Triton's loopback HTTP port (anchor, proxy; ours: read from /proc)
        self._logs: list[object] = []
        self._work = log_dir / f"{kind}-work"

    # -- processes --
    def _spawn(self, name: str, cmd: list[str], env: dict[str, str], sig: int) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{self.kind}-{self.model}-{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=lambda: _die_with_parent(sig),
        )
        self.procs.append(proc)
        return proc

    def _wait(self, port: int, path: str, deadline: float) -> None:
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{self.kind}: {proc.args[0]} exited with {proc.returncode} (logs: {self.log_dir})"
                    )
            if http_status(port, "GET", path, timeout=1.0) == 200:
                return
            time.sleep(0.02)
        raise TimeoutError(f"{self.kind}: {path} not 200 within {START_TIMEOUT_S:.0f} s (logs in {self.log_dir})")

    def start(self) -> float:
        started = time.monotonic()
        deadline = started + START_TIMEOUT_S
        try:
            if self.kind == "anchor" and self.mme:  # native serve: an empty repository, models come by url
                self._work.mkdir(parents=True, exist_ok=True)
                env = {**self.setup.env, "SAGEMAKER_MULTI_MODEL": "true"}
                self._spawn("triton", self.setup.sagemaker_command(self._work, None, self.port), env, 9)
                self._wait(self.port, "/ping", deadline)
            elif self.kind == "anchor":
                self._triton_port = free_port()
                cmd, env = self.setup.anchor(self.repository, self.model, self.port, self._triton_port)
                self._spawn("triton", cmd, env, 9)
                self._wait(self.port, "/ping", deadline)
            elif self.ours:
                self._work.mkdir(parents=True, exist_ok=True)
                env = {**self.setup.env, **self.serve_env, "SMTRITON_WORK_DIR": str(self._work)}
                revision = ours_revision(self.kind)
                if revision is not None:  # that commit's smtriton first on the path, not the working tree's
                    env["PYTHONPATH"] = first_on_path(export_revision(revision, self.log_dir), env)
                    env["PYTHONSAFEPATH"] = "1"
                workers = ours_workers(self.kind)
                if workers is not None:
                    env["SAGEMAKER_MODEL_SERVER_WORKERS"] = str(workers)
                if self.kind == UNMERGED:
                    env["SMTRITON_MERGE_REQUESTS"] = "false"
                if self.mme:
                    args = ["--multi-model", "--model-root", str(self.repository)]
                else:
                    args = ["--model-repository", str(self.repository), "--default-model", self.model]
                log = self.log_dir / f"{self.kind}-{self.model}-serve.log"
                self.serve = ServeProcess(args, log, env=env, port=self.port, append_log=True, die_with_parent=True)
                self.serve.wait_healthy(deadline - time.monotonic(), interval=0.02)
            else:  # the proxy: a loopback Triton, then the front
                triton_port = self._triton_port = free_port()
                cmd = self.setup.command(self.repository, self.model, triton_port)
                self._spawn("triton", cmd, self.setup.env, 9)
                self._wait(triton_port, f"/v2/models/{self.model}/ready", deadline)
                env = {**_clean_env(), "BENCH_TRITON_URL": f"{LOOPBACK}:{triton_port}", "BENCH_MODEL": self.model}
                how, target, workers = PROXY
                if how == "uvicorn":
                    cmd = [sys.executable, "-m", "uvicorn", target, "--workers", str(workers), "--no-access-log"]
                    cmd += ["--log-level", "warning"]
                else:
                    cmd = [sys.executable, "-m", target, "--workers", str(workers)]
                self._spawn("front", [*cmd, "--host", LOOPBACK, "--port", str(self.port)], env, 9)
                self._wait(self.port, "/ping", deadline)
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - started

    @property
    def ours(self) -> bool:
        """``serve`` itself, with its default number of front workers or another."""
        return (
            self.kind in ("ours", UNMERGED)
            or ours_workers(self.kind) is not None
            or ours_revision(self.kind) is not None
        )

    def triton_port(self) -> int | None:
        """The loopback HTTP port of this server's Triton (ours: from its command line), for its statistics."""
        if self._triton_port is not None or not self.ours:
            return self._triton_port
        return triton_http_port(self.pids()["triton"])

    def memory(self) -> dict[str, object]:
        """Resident memory of the Python front's processes now (serve: its main process and workers)."""
        front = self.pids()["front"]
        each = [m for m in (memory_kib(pid) for pid in front) if m]
        return {
            "server": self.kind,
            "model": self.model,
            "processes": len(each),
            **{f"{key}_mib": sum(m[key] for m in each) / 1024 for key in ("rss", "pss", "private")},
        }

    def _roots(self) -> list[int]:
        """The pids this server started (each the root of a process tree), in start order."""
        return [proc.pid for proc in self.procs] + ([self.serve.pid] if self.serve is not None else [])

    @property
    def front_pid(self) -> int:
        """The Python front end (serve, the proxy or a prototype): the last process started."""
        return self._roots()[-1]

    def pids(self) -> dict[str, list[int]]:
        """Live pids by role: ``front`` (the Python front end), ``triton`` (tritonserver and its stubs)."""
        roles: dict[str, list[int]] = {"front": [], "triton": []}
        for root in self._roots():
            for pid in process_tree(root):
                roles["triton" if self.kind == "anchor" or "triton" in comm(pid) else "front"].append(pid)
        return roles

    def stop(self) -> None:
        """Front first (serve drains and stops its Triton), then every process left in every tree."""
        alive = {pid: start_time(pid) for root in self._roots() for pid in process_tree(root)}
        if self.serve is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.serve.stop(30)
            self.serve = None
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(30)
        for pid, started in alive.items():
            if started is not None and start_time(pid) == started:  # still that process, not a reused pid
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        self.procs.clear()
        for log in self._logs:
            log.close()  # type: ignore[attr-defined]
        self._logs.clear()
        shutil.rmtree(self._work, ignore_errors=True)
