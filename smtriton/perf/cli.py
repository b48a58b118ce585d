"""`smtriton perf`: throughput and latency of a model through SageMaker's contract, step by step."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.live import Live
from rich.text import Text

from smtriton.cli_options import (
    BatchSizeOpt,
    DurationOpt,
    EndpointUrlOpt,
    InputSeedOpt,
    RegionOpt,
    ShapeOpt,
    TargetModelOpt,
    WarmupOpt,
)
from smtriton.errors import ToolError, ToolUsageError
from smtriton.perf import report
from smtriton.perf.bodies import build_bodies, parse_shapes
from smtriton.perf.runner import ServerGone, StepPlan, run
from smtriton.perf.stats import PERCENTILES, percentile_key
from smtriton.perf.targets import EndpointTarget, HttpTarget, Target, is_url

console = Console(stderr=True)


def parse_loads(text: str | None, option: str) -> list[float]:
    """``1,2,4`` into [1.0, 2.0, 4.0]; every value positive."""
    if not text:
        return []
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ToolUsageError(f"{option} {text!r}: expected numbers separated by commas") from None
    if not values or any(v <= 0 for v in values):
        raise ToolUsageError(f"{option} {text!r}: every value must be positive")
    if option == "--concurrency" and any(v != int(v) for v in values):
        raise ToolUsageError(f"{option} {text!r}: concurrency is a whole number of workers")
    return values


class LiveLine:
    """The progress line: the step, its phase, and the answers per second since the last tick."""

    def __init__(self, live: Live) -> None:
        self.live = live
        self.label, self.elapsed, self.completed = "", 0.0, 0

    def __call__(self, label: str, phase: str, elapsed: float, completed: int) -> None:
        if label != self.label or elapsed <= self.elapsed:  # a new step
            self.label, self.elapsed, self.completed = label, 0.0, 0
        rate = (completed - self.completed) / max(elapsed - self.elapsed, 1e-9)
        self.elapsed, self.completed = elapsed, completed
        self.live.update(Text(f"{label}  {phase}  {elapsed:5.1f} s  {completed:,} answered  {rate:,.0f}/s now"))


def check_choices(body_format: str, arrival: str, chart_latency: str) -> None:
    """Options with a fixed set of values, refused with the values they take."""
    if body_format not in ("binary", "json"):
        raise ToolUsageError(f"--body-format {body_format!r}: binary or json")
    if arrival not in ("fixed", "poisson"):
        raise ToolUsageError(f"--arrival {arrival!r}: fixed or poisson")
    if chart_latency not in [percentile_key(q) for q in PERCENTILES]:
        raise ToolUsageError(f"--chart-latency {chart_latency!r}: p50, p90, p99 or p99.9")


def perf(
    target: Annotated[
        str,
        typer.Argument(
            metavar="TARGET", help="http://HOST:PORT of serve (or a local endpoint's serve), or an endpoint name"
        ),
    ],
    model_dir: Annotated[
        Optional[Path],  # noqa: UP045 - typer needs Optional at runtime on 3.10
        typer.Option(help="Triton model folder: random inputs of its config's dtypes and shapes"),
    ] = None,
    input_file: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            metavar="NAME=FILE.npy|BODY", help="NAME=FILE.npy (repeatable), or one ready .json / binary+json .bin body"
        ),
    ] = None,
    shape: ShapeOpt = None,
    batch_size: BatchSizeOpt = 1,
    body_format: Annotated[str, typer.Option(help="binary (binary+json) or json request bodies")] = "binary",
    concurrency: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Closed-loop steps: requests in flight, e.g. 1,2,4,8,16 [default without --rate]"),
    ] = None,
    rate: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Open-loop steps: requests started per second, e.g. 100,200,400"),
    ] = None,
    arrival: Annotated[str, typer.Option(help="Open loop: fixed (even gaps) or poisson (random gaps)")] = "fixed",
    connections: Annotated[int, typer.Option(min=1, help="Open loop: most requests in flight at once")] = 64,
    warmup: WarmupOpt = 2.0,
    duration: DurationOpt = 10.0,
    target_model: TargetModelOpt = None,
    endpoint_url: EndpointUrlOpt = None,
    region: RegionOpt = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the results as JSON")] = None,  # noqa: UP045
    csv_out: Annotated[Optional[Path], typer.Option("--csv", help="Write the results as CSV")] = None,  # noqa: UP045
    chart: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Write PREFIX.png and PREFIX.html: throughput against latency, a point per step"),
    ] = None,
    chart_latency: Annotated[str, typer.Option(help="Latency the chart plots: p50, p90, p99 or p99.9")] = "p99",
    seed: InputSeedOpt = 0,
) -> None:
    """Measure throughput and latency through SageMaker's contract, locally or against an endpoint.

    Closed-loop concurrency steps and open-loop rate steps; per step: requests/s, p50/p90/p99/p99.9
    latency, errors by status, and the client's own CPU (a saturated client is flagged, not mistaken
    for the server). A TARGET that is no http:// URL is an endpoint name, called through boto3.
    """
    check_choices(body_format, arrival, chart_latency)
    levels = parse_loads(concurrency, "--concurrency")
    rates = parse_loads(rate, "--rate")
    if not levels and not rates:
        levels = [1, 2, 4, 8, 16]
    plans = [StepPlan("concurrency", c, warmup, duration) for c in levels]
    plans += [StepPlan("rate", r, warmup, duration, arrival, connections) for r in rates]
    bodies = build_bodies(
        model_dir=model_dir,
        input_files=input_file or [],
        batch_size=batch_size,
        shapes=parse_shapes(shape or []),
        binary=body_format == "binary",
        seed=seed,
    )
    client: Target
    if is_url(target):
        client = HttpTarget(target, bodies, target_model)
    else:
        workers = int(max([*levels, connections if rates else 1]))
        client = EndpointTarget(
            target, bodies, target_model=target_model, endpoint_url=endpoint_url, region=region, workers=workers
        )
    client.check()
    console.print(f"perf: {client.description}, {len(plans)} steps of {warmup:g} s warm-up + {duration:g} s")
    stopped: ServerGone | None = None
    with Live(Text(), console=console, transient=True, refresh_per_second=4) as live:
        try:
            results = run(client, plans, LiveLine(live))
        except ServerGone as exc:  # the steps before it are reported, then the reason as the error
            results, stopped = exc.results, exc
    if stopped is not None and not results:
        raise ToolError(str(stopped))
    title = f"smtriton perf: {client.description}"
    console.print(report.table(results, title))
    for r in results:
        for note in r.notes:
            console.print(f"[yellow]{r.label}:[/] {note}", highlight=False)
    meta = {"target": target, "description": client.description, "body_bytes": len(bodies[0].data),
            "content_type": bodies[0].content_type, "client_pid": os.getpid()}  # fmt: skip
    if json_out:
        json_out.write_text(report.to_json(results, meta) + "\n", encoding="utf-8")
    if csv_out:
        report.write_csv(results, csv_out)
    if chart:
        for path in report.write_chart(results, chart, chart_latency, title):
            console.print(f"wrote {path}")
    if stopped is not None:
        raise ToolError(str(stopped))
    if not any(r.ok for r in results):
        errors: Counter[str] = Counter()
        for r in results:
            errors.update(r.errors)
        raise ToolError(f"no request succeeded (errors by status: {json.dumps(dict(errors))})")
