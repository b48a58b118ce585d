"""``python -m bench.crash``: what a Triton crash under load costs, with requests waiting for Triton
(the default) and without (``SMTRITON_WAIT_FOR_TRITON=false``).

``--clients`` threads post the tiny ``addsub`` request (tests/integration/models) in a loop, each on a
fresh connection, to a ``serve`` of ``--workers`` front workers; after a few seconds its Triton is
killed (SIGKILL) ``--kills`` times, ``--gap`` seconds apart, each kill once the endpoint serves again.
Printed per run: the requests answered, those failed (by status), the slowest answer, the restart time
(kill → ``/ping`` 200) and the p50/p99 of the requests sent while Triton was down. A benchmark, not a
test: tests/integration/test_faults.py holds the behaviour to its rules.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

import requests

from smtriton.local.serve_process import ServeProcess

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "integration" / "models"
BODY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [3] * 16},
        ]
    }
).encode()
EXPECTED = [i + 3 for i in range(16)]


def _triton_pid(marker: str) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if args[0].endswith(b"tritonserver") and any(marker.encode() in a for a in args):
                return int(entry.name)
    raise RuntimeError("no Triton found")


def run(wait: bool, clients: int, workers: int, kills: int, gap: float, work: Path) -> dict[str, object]:
    repository = work / f"models-{wait}"
    shutil.copytree(MODELS / "addsub", repository / "addsub")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))},
        "SAGEMAKER_MODEL_SERVER_WORKERS": str(workers),
        "SMTRITON_WAIT_FOR_TRITON": "true" if wait else "false",
    }
    server = ServeProcess(["--model-repository", str(repository)], work / f"serve-{wait}.log", env=env)
    outcomes: list[tuple[float, float, int]] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            sent = time.monotonic()
            try:
                r = requests.post(f"{server.url}/invocations", data=BODY, timeout=120)
                ok = r.status_code == 200 and r.json()["outputs"][0]["data"] == EXPECTED
                status = r.status_code if ok or r.status_code != 200 else -2
            except requests.RequestException:
                status = -1
            outcomes.append((sent, time.monotonic(), status))

    try:
        server.wait_healthy()
        threads = [threading.Thread(target=client) for _ in range(clients)]
        for thread in threads:
            thread.start()
        time.sleep(3)
        downtimes: list[tuple[float, float]] = []
        for _ in range(kills):
            os.kill(_triton_pid(str(repository)), signal.SIGKILL)
            killed = time.monotonic()
            while requests.get(f"{server.url}/ping", timeout=5).status_code == 200:
                time.sleep(0.01)
            server.wait_healthy(120, interval=0.05)
            downtimes.append((killed, time.monotonic()))
            time.sleep(max(0.0, killed + gap - time.monotonic()))
        time.sleep(2)
        stop.set()
        for thread in threads:
            thread.join(180)
    finally:
        stop.set()
        server.stop()
    failed: dict[int, int] = {}
    for _, _, status in outcomes:
        if status != 200:
            failed[status] = failed.get(status, 0) + 1
    during = sorted(done - sent for sent, done, _ in outcomes if any(a <= sent < b for a, b in downtimes))
    return {
        "waiting": wait,
        "requests": len(outcomes),
        "failed": failed,
        "slowest_s": round(max(done - sent for sent, done, _ in outcomes), 3),
        "restart_s": [round(b - a, 2) for a, b in downtimes],
        "sent_while_down": len(during),
        "p50_while_down_s": round(statistics.median(during), 3) if during else None,
        "p99_while_down_s": round(during[int(0.99 * (len(during) - 1))], 3) if during else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument("--gap", type=float, default=6.0, help="seconds between kills")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-crash-") as work:
        for wait in (True, False):
            result = run(wait, args.clients, args.workers, args.kills, args.gap, Path(work))
            print(json.dumps(result))


if __name__ == "__main__":
    main()
