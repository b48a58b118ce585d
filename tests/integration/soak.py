"""Bounded soak: `serve` under constant load for a fixed time; zero errors, flat memory.

    .venv/bin/python -m tests.integration.soak --seconds 300 --concurrency 32   # the full 5-minute soak

CI runs a short one (tests/integration/test_soak.py). Traffic goes to 127.0.0.1 only, and every
process started here is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from tests.integration.harness import ServeProcess

MODELS = Path(__file__).parent / "models"
BODY = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [2] * 16},
        ]
    }
).encode()
EXPECTED = [i + 2 for i in range(16)]


@dataclass
class SoakResult:
    requests: int = 0
    errors: list[str] = field(default_factory=list)
    rss_start_kib: int = 0
    rss_end_kib: int = 0

    @property
    def growth(self) -> float:
        return (self.rss_end_kib - self.rss_start_kib) / self.rss_start_kib


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


async def _load(url: str, seconds: float, concurrency: int, result: SoakResult) -> None:
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:

        async def worker() -> None:
            while time.monotonic() < deadline:
                try:
                    async with session.post(url, data=BODY, headers={"Content-Type": "application/json"}) as r:
                        payload = await r.read()
                    if r.status != 200 or json.loads(payload)["outputs"][0]["data"] != EXPECTED:
                        result.errors.append(f"{r.status}: {payload[:200]!r}")
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    result.errors.append(repr(exc))
                result.requests += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def soak(seconds: float, concurrency: int, warmup: float = 5.0) -> SoakResult:
    """Start serve on the addsub test model, warm it up, then load it for ``seconds``."""
    work = Path(tempfile.mkdtemp(prefix="smtriton-soak-"))
    repo = work / "models"
    shutil.copytree(MODELS / "addsub", repo / "addsub", ignore=shutil.ignore_patterns("__pycache__"))
    server = ServeProcess(repo, "addsub", work / "serve.log", env={"SMTRITON_LOG_LEVEL": "warning"})
    try:
        server.wait_healthy()
        url = f"{server.url}/invocations"
        result = SoakResult()
        asyncio.run(_load(url, warmup, concurrency, SoakResult()))  # allocator and pools reach steady state
        result.rss_start_kib = rss_kib(server.pid)
        asyncio.run(_load(url, seconds, concurrency, result))
        result.rss_end_kib = rss_kib(server.pid)
        return result
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    result = soak(args.seconds, args.concurrency)
    print(
        f"{result.requests} requests in {args.seconds:.0f} s at concurrency {args.concurrency}: "
        f"{len(result.errors)} errors, serve RSS {result.rss_start_kib} -> {result.rss_end_kib} KiB "
        f"({result.growth:+.1%})"
    )
    raise SystemExit(0 if not result.errors and result.growth < 0.05 else 1)


if __name__ == "__main__":
    main()
