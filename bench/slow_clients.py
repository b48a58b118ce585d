"""``python -m bench.slow_clients``: what slow clients cost a front worker (docs/operations.md, "Slow
clients").

One ``serve`` with one worker in front of the tiny ``addsub`` model (tests/integration/models): the
worker's descriptors and resident memory at rest, then with ``--connections`` connections each holding
a request whose body arrives a byte a second (well inside the pause limit), and the cost of one.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path

import requests

from smtriton.local.serve_process import ServeProcess, worker_pids

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "integration" / "models"
HEAD = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{"


def _sample(pid: int) -> tuple[int, int]:
    """(open descriptors, resident KiB) of a process."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return len(os.listdir(f"/proc/{pid}/fd")), next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))


def run(connections: int, seconds: int, work: Path) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))}
    env |= {"SAGEMAKER_MODEL_SERVER_WORKERS": "1", "SMTRITON_WORK_DIR": str(work)}
    server = ServeProcess(["--model-repository", str(MODELS), "--default-model", "addsub"], work / "serve.log", env=env)
    held: list[socket.socket] = []
    try:
        server.wait_healthy()
        (worker,) = worker_pids(server.pid)
        for _ in range(50):
            requests.get(f"{server.url}/ping", timeout=5)
        time.sleep(2)
        rest = _sample(worker)
        for _ in range(connections):
            held.append(socket.create_connection(("127.0.0.1", server.port)))
            held[-1].sendall(HEAD)
        for _ in range(seconds):
            time.sleep(1)
            for connection in held:
                connection.sendall(b" ")
        loaded = _sample(worker)
    finally:
        for connection in held:
            connection.close()
        server.stop()
    return {
        "connections": connections,
        "rest": {"descriptors": rest[0], "rss_kib": rest[1]},
        "held": {"descriptors": loaded[0], "rss_kib": loaded[1]},
        "per_connection": {
            "descriptors": round((loaded[0] - rest[0]) / connections, 2),
            "rss_kib": round((loaded[1] - rest[1]) / connections, 1),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=400)
    parser.add_argument("--seconds", type=int, default=5, help="how long each body trickles before the sample")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-slow-clients-") as work:
        print(json.dumps(run(args.connections, args.seconds, Path(work))))


if __name__ == "__main__":
    main()
