"""``python -m bench.transform``: a batch transform job through the local runner, MultiRecord against
SingleRecord, on the demo text encoder.

N records (JSON Lines, one KServe v2 request a line: ``input_ids`` INT64 and ``attention_mask`` INT32 of
shape ``[1, L]``), written once for each kind of lengths: ``equal`` (every record of length 16: all can
merge) and ``mixed`` (L drawn from 8, 16, 32: only records of one length can). One ``serve`` as a batch
transform job starts it (``SAGEMAKER_BATCH=true``, nothing else the job did not set), then for each
kind and strategy a warm-up job on the first records and the timed job, both through
:func:`smtriton.local.transform.run_job`, as ``smtriton local-transform`` runs them. Triton's own
counters (re-exported on serve's metrics port) before and after each timed job give what the job cost
Triton: its requests, the rows in them and its executions, so the rows per Triton request (the front's
merge) and Triton's mean executed batch size (the front's merge and Triton's dynamic batcher together).
The strategies' outputs are checked against each other (same lines, values within 1e-4).

Prints a table and writes the results as JSON (``--output``). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
import requests
from prometheus_client.parser import text_string_to_metric_families

from bench.scenarios import not_built
from smtriton.aws.batch_job import BatchJob
from smtriton.local import transform
from smtriton.local.serve_process import ServeProcess, free_port

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = {"equal": (16,), "mixed": (8, 16, 32)}
VOCABULARY = 1000
WARM_UP_RECORDS = 200
COUNTERS = ("nv_inference_request_success_total", "nv_inference_count_total", "nv_inference_exec_count_total")


def write_records(path: Path, count: int, lengths: tuple[int, ...], seed: int) -> None:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as file:
        for length in rng.choice(lengths, count):
            ids = rng.integers(0, VOCABULARY, int(length)).tolist()
            request = {
                "inputs": [
                    {"name": "input_ids", "shape": [1, int(length)], "datatype": "INT64", "data": ids},
                    {"name": "attention_mask", "shape": [1, int(length)], "datatype": "INT32", "data": [1] * len(ids)},
                ]
            }
            file.write(orjson.dumps(request) + b"\n")


def triton_counters(metrics_url: str, model: str) -> dict[str, float]:
    """Triton's requests, inferences (rows) and executions of ``model`` so far."""
    totals = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(requests.get(metrics_url, timeout=10).text):
        for sample in family.samples:
            if sample.name in totals and sample.labels.get("model") == model:
                totals[sample.name] += sample.value
    return totals


def run(url: str, job: BatchJob, source: Path, output: Path) -> tuple[transform.Summary, transform.Plan]:
    async def main() -> tuple[transform.Summary, transform.Plan]:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            plan = job.settle(await transform.execution_parameters(session, url))
        return await transform.run_job(url, job, transform.input_files(source), output, plan), plan

    return asyncio.run(main())


def answers(path: Path) -> list[np.ndarray]:
    """Every output line's values, flattened (output by output, as Triton listed them)."""
    return [
        np.concatenate([np.asarray(o["data"], dtype=np.float64) for o in orjson.loads(line)["outputs"]])
        for line in path.read_bytes().splitlines()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.transform", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--model", default="text_encoder")
    parser.add_argument("--lengths", default="equal,mixed", help="equal, mixed or both")
    parser.add_argument("--strategies", default="MultiRecord,SingleRecord")
    parser.add_argument("--max-concurrent", type=int, help="MaxConcurrentTransforms [default: serve's answer]")
    parser.add_argument("--max-payload-mb", type=int, help="MaxPayloadInMB [default: serve's answer, 6]")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "transform.json")
    args = parser.parse_args(argv)
    missing = not_built(args.repository, args.model)
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    kinds = [kind.strip() for kind in args.lengths.split(",") if kind.strip()]
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="bench-transform-") as scratch:
        tmp = Path(scratch)
        for seed, kind in enumerate(kinds):
            write_records(tmp / "in" / kind / "records.jsonl", args.records, LENGTHS[kind], seed)
            write_records(tmp / "warm" / kind / "records.jsonl", WARM_UP_RECORDS, LENGTHS[kind], 100 + seed)
        metrics_port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))}
        env |= {"SAGEMAKER_BATCH": "true", "SMTRITON_METRICS_PORT": str(metrics_port), "SMTRITON_WORK_DIR": scratch,
                "SMTRITON_LOG_LEVEL": "warning"}  # fmt: skip
        args_serve = ["--model-repository", str(args.repository), "--default-model", args.model]
        serve = ServeProcess(args_serve, tmp / "serve.log", env=env)
        try:
            serve.wait_healthy(600, models=[args.model])
            metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
            for kind in kinds:
                outputs: dict[str, Path] = {}
                for strategy in strategies:
                    job = BatchJob(content_type="application/jsonlines", split_type="Line", batch_strategy=strategy,
                                   max_concurrent=args.max_concurrent, max_payload_mb=args.max_payload_mb)  # fmt: skip
                    run(serve.url, job, tmp / "warm" / kind, tmp / "warm-out" / kind / strategy)
                    before = triton_counters(metrics_url, args.model)
                    started = time.perf_counter()
                    summary, plan = run(serve.url, job, tmp / "in" / kind, tmp / "out" / kind / strategy)
                    seconds = time.perf_counter() - started
                    after = triton_counters(metrics_url, args.model)
                    triton_requests, inferences, executions = (after[c] - before[c] for c in COUNTERS)
                    outputs[strategy] = tmp / "out" / kind / strategy / "records.jsonl.out"
                    rows.append({
                        "lengths": kind, "strategy": strategy, "records": summary.records,
                        "failed": summary.failed_records, "requests": summary.requests,
                        "max_concurrent": plan.concurrency, "max_payload_bytes": plan.payload_bytes,
                        "seconds": round(seconds, 3), "records_per_s": round(summary.records / seconds, 1),
                        "triton_requests": triton_requests, "triton_rows": inferences, "triton_executions": executions,
                        "rows_per_triton_request": round(inferences / triton_requests, 2) if triton_requests else None,
                        "mean_executed_batch": round(inferences / executions, 2) if executions else None,
                    })  # fmt: skip
                    print(rows[-1], flush=True)
                if len(outputs) > 1:
                    first, *others = outputs.values()
                    reference = answers(first)
                    for path in others:
                        got = answers(path)
                        assert len(got) == len(reference), f"{path}: {len(got)} lines, not {len(reference)}"
                        worst = max(float(np.max(np.abs(a - b))) for a, b in zip(reference, got, strict=True))
                        assert worst <= 1e-4, f"{path}: values differ by {worst} from {first}"
        finally:
            serve.stop(60)
    table = ["| lengths | strategy | records/s | requests | Triton requests | rows per Triton request | "
             "Triton's mean batch |", "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for row in rows:
        table.append(
            f"| {row['lengths']} | {row['strategy']} | {row['records_per_s']} | {row['requests']} | "
            f"{row['triton_requests']:.0f} | {row['rows_per_triton_request']} | {row['mean_executed_batch']} |"
        )
    print("\n".join(table))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    machine = {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version()}
    args.output.write_bytes(orjson.dumps({"machine": machine, "rows": rows}, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
