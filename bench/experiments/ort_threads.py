"""The text encoder at c=16 with ONNX Runtime's intra-op thread count forced, per server (bench/NOTES.md).

``python -m bench.experiments.ort_threads [--threads 1,2] [--servers anchor,ours,x-proto]``: for each
count, a temporary copy of the demo ``text_encoder`` (the model file linked, the config plus
``parameters { key: "intra_op_thread_count" ... }``) is served by each server in turn and driven as the
``text_binary`` scenario. The demo repository itself is not touched.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from bench.load import run_wrk
from bench.scenarios import DEMO_REPOSITORY, build_scenarios
from bench.servers import Server, TritonSetup, loadavg

MODEL = "text_encoder"


def _repository(root: Path, threads: int) -> Path:
    repo = root / f"repo-intra{threads}"
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "1" / "model.onnx").symlink_to(DEMO_REPOSITORY / MODEL / "1" / "model.onnx")
    config = (DEMO_REPOSITORY / MODEL / "config.pbtxt").read_text()
    config += f'parameters {{ key: "intra_op_thread_count" value: {{ string_value: "{threads}" }} }}\n'
    (repo / MODEL / "config.pbtxt").write_text(config)
    return repo


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--threads", default="1,2")
    p.add_argument("--servers", default="anchor,ours,x-proto")
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=2.0)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="smtriton-bench-ort-"))
    try:
        setup = TritonSetup.create(work)
        scenario = next(s for s in build_scenarios() if s.name == "text_binary")
        body = work / "body"
        body.write_bytes(scenario.body)
        for threads in (int(t) for t in args.threads.split(",")):
            repo = _repository(work, threads)
            for kind in args.servers.split(","):
                server = Server(kind, setup, repo, MODEL, work)
                server.start()
                try:
                    run_wrk(server, "/invocations", args.connections, args.warmup, body, scenario.content_type)
                    m = run_wrk(server, "/invocations", args.connections, args.duration, body, scenario.content_type)
                finally:
                    server.stop()
                front = "-" if m.front_cpu_ms is None else f"{m.front_cpu_ms:.2f}"
                print(
                    f"intra_op={threads} {kind:>8} c={args.connections}: {m.throughput:7,.0f} req/s "
                    f"p50 {m.p50_ms:6.2f} ms p99 {m.p99_ms:6.2f} ms  CPU ms/req front {front} Triton "
                    f"{m.triton_cpu_ms:.2f}  others' CPU {m.other_cpu:.2f}  load {loadavg()[0]:.2f}",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
