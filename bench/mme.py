"""Multi-model load latency: ``POST /models`` → 200 on the anchor's and on our multi-model endpoint.

Both load the same model directory (the text encoder, in the archive layout SageMaker extracts:
``<root>/<id>/model/<model dir>``), answer one inference on it (checked against the SME answer), and
unload it; each trial uses a fresh model name, as SageMaker does for each archive.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import orjson

from bench.scenarios import Scenario, check
from bench.servers import Server, http_status, post


def model_root(work: Path, repository: Path, model: str, trials: int) -> Path:
    """A model root holding one extracted archive per trial (SageMaker never loads one url twice)."""
    root = work / "mme-root"
    for trial in range(trials):
        shutil.copytree(repository / model, root / f"t{trial}" / "model" / model, dirs_exist_ok=True)
    return root


def measure(server: Server, root: Path, trials: int, scenario: Scenario, reference: object) -> list[dict[str, object]]:
    """Load → invoke → unload, ``trials`` times; the load and unload latencies of each."""
    rows: list[dict[str, object]] = []
    for trial in range(trials):
        name = f"bench{trial}"
        url = str(root / f"t{trial}" / "model")
        load = orjson.dumps({"model_name": name, "url": url})
        started = time.perf_counter()
        status = post(server.port, "/models", load, "application/json", timeout=300)[0]
        load_s = time.perf_counter() - started
        if status != 200:
            raise RuntimeError(f"{server.kind}: loading {url} answered {status}")
        answer = post(server.port, f"/models/{name}/invoke", scenario.body, scenario.content_type)
        problem = check(answer, reference)
        started = time.perf_counter()
        status = http_status(server.port, "DELETE", f"/models/{name}", timeout=300)
        unload_s = time.perf_counter() - started
        if status != 200:
            raise RuntimeError(f"{server.kind}: unloading {name} answered {status}")
        rows.append({"server": server.kind, "trial": trial, "load_s": load_s, "unload_s": unload_s, "problem": problem})
    return rows
