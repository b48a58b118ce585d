"""`smtriton tune`: the configuration of a model with the most throughput under a latency budget."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from smtriton import model_config
from smtriton.errors import ToolError, ToolUsageError
from smtriton.perf.bodies import build_bodies, parse_shapes
from smtriton.perf.cli import parse_loads
from smtriton.perf.runner import StepPlan
from smtriton.serve.gpu import gpu_models
from smtriton.tune import report
from smtriton.tune.knobs import apply, describe, key, knobs_for
from smtriton.tune.search import TrialStore, confirm, coordinate_descent, record_key
from smtriton.tune.trial import measure

console = Console(stderr=True)


def tune(
    model_dir: Annotated[Path, typer.Argument(metavar="MODEL_DIR", help="Triton model folder (config.pbtxt, 1/...)")],
    p99_ms: Annotated[
        Optional[float],  # noqa: UP045 - typer needs Optional at runtime on 3.10
        typer.Option("--p99-ms", min=0, help="Latency budget: a step counts only if its p99 is within it"),
    ] = None,
    work_dir: Annotated[
        Path, typer.Option(help="Trials (trials.jsonl), their serve logs, report and chart; a rerun resumes here")
    ] = Path("tune-work"),
    output: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--output", "-o", help="Folder to write the winning config.pbtxt into [default: print it]"),
    ] = None,
    max_trials: Annotated[int, typer.Option(min=1, help="Trials in all, the baseline included")] = 12,
    min_gain: Annotated[
        float, typer.Option(min=0, help="A change is kept only if it beats the incumbent by this share (noise)")
    ] = 0.05,
    max_instances: Annotated[int, typer.Option(min=1, help="Instance counts tried: 1 to this")] = 2,
    concurrency: Annotated[str, typer.Option(help="Closed-loop steps of each trial")] = "1,4,8,16",
    warmup: Annotated[float, typer.Option(min=0, help="Unmeasured seconds before each step")] = 1.0,
    duration: Annotated[float, typer.Option(min=0.1, help="Measured seconds per step")] = 3.0,
    shape: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(metavar="NAME=D1,D2", help="An input's shape without the batch dim, for variable dims"),
    ] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Batch dim of each request (batching models)")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the random inputs")] = 0,
    confirm_winner: Annotated[
        bool, typer.Option("--confirm/--no-confirm", help="Measure the baseline and the winner again")
    ] = True,
    repeats: Annotated[
        int, typer.Option(min=1, help="How many times --confirm measures each of them again, in turns")
    ] = 2,
) -> None:
    """Serve a model with candidate configurations and keep the one with most throughput under --p99-ms.

    Each trial serves the model locally (serve and Triton) with one candidate config.pbtxt and measures
    it with perf's engine. The search starts from the model's own config (trial 0) and tries one knob at
    a time: instance count, dynamic batching and its queue delay, max batch size, preferred batch sizes,
    and the backend's own (ONNX Runtime threads and graph optimisation; PyTorch INFERENCE_MODE and
    DISABLE_OPTIMIZED_EXECUTION). A change is kept only if it beats the incumbent by --min-gain.
    """
    try:
        baseline = model_config.read(model_dir)
    except OSError as exc:
        raise ToolUsageError(f"{model_dir}: no readable config.pbtxt ({exc.strerror or exc})") from None
    if model_config.is_ensemble(baseline):
        raise ToolUsageError(f"{model_dir}: an ensemble runs no model of its own; tune the models it calls")
    levels = parse_loads(concurrency, "--concurrency")
    plans = [StepPlan("concurrency", c, warmup, duration) for c in levels]
    shapes = parse_shapes(shape or [])
    bodies = build_bodies(model_dir=model_dir, input_files=[], batch_size=batch_size, shapes=shapes,
                          binary=True, seed=seed)  # fmt: skip
    knobs = knobs_for(baseline, max_instances, gpu=bool(gpu_models()))
    if batch_size > 1:  # a smaller max_batch_size would refuse every request
        knobs = [k for k in knobs if k.name != "max_batch_size" or all(v >= batch_size for v in k.values)]
    settings = {"model": model_config.served_name(baseline, model_dir), "baseline": model_config.to_text(baseline),
                "concurrency": levels, "warmup": warmup, "duration": duration, "batch_size": batch_size,
                "shapes": shapes, "seed": seed}  # fmt: skip
    store = TrialStore(work_dir, settings)

    def run_trial(changes: dict[str, Any], repeat: int) -> tuple[dict[str, Any], bool]:
        name = describe(changes) + (f" (again, #{repeat})" if repeat else "")
        found = store.get(changes, repeat)
        if found is not None and not found["error"]:
            console.print(f"trial {name}: measured before, resumed from {store.path}")
            return found, True
        if found is not None:  # what kept serve from starting may be fixed by now: try again
            console.print(f"trial {name}: failed before ({found['error'].splitlines()[0][:100]}), trying again")
        config = apply(baseline, changes, knobs)
        console.print(f"trial {name}: serving and measuring {len(plans)} steps ...")
        folder = work_dir / "trials" / str(store.measured)
        record = measure(model_dir, config, changes, folder, bodies, plans, record_key(changes, repeat))
        store.add(record)
        if record["error"]:
            console.print(f"  [yellow]serve did not start with this config[/]: {record['error'].splitlines()[0]}")
        else:
            best = max(record["steps"], key=lambda s: s["throughput_rps"])
            console.print(f"  {best['throughput_rps']:,.0f} req/s at c={best['load']:g} (any latency)")
        return record, False

    search = coordinate_descent(baseline, knobs, run_trial, p99_ms=p99_ms, max_trials=max_trials, min_gain=min_gain)
    if confirm_winner:
        confirm(search, run_trial, p99_ms=p99_ms, min_gain=min_gain, repeats=repeats)
    assert search.winner is not None
    title = f"smtriton tune: {settings['model']}" + (f", p99 <= {p99_ms:g} ms" if p99_ms is not None else "")
    console.print(report.table(search, title), width=max(console.width, 140), crop=False)  # a verdict per line
    line = report.summary(search, p99_ms)
    console.print(line, highlight=False, soft_wrap=True)
    if search.confirmation is not None:
        base_scores, win_scores = (", ".join(f"{v:,.0f}" for v in scores) for scores in search.confirmation)
        held = "" if search.confirmed else ": the gain did not hold, so the baseline stays"
        times = len(search.confirmation[0])
        console.print(f"measured {times} times: baseline {base_scores} req/s, winner {win_scores} req/s{held}",
                      highlight=False)  # fmt: skip
    if search.stopped_by_budget:
        console.print(f"[yellow]stopped at --max-trials {max_trials}[/]: knobs left untried", highlight=False)
    winner = apply(baseline, search.winner.changes, knobs)
    model_config.write(winner, work_dir)
    summary = {"winner": search.winner.trial, "changes": search.winner.changes, "summary": line, "p99_ms": p99_ms,
               "trials": [{"trial": o.trial, "key": key(o.changes), "score_rps": o.score, "verdict": o.verdict,
                           "step": o.step, "resumed": o.resumed} for o in search.outcomes],
               "confirmation": search.confirmation, "confirmed": search.confirmed}  # fmt: skip
    (work_dir / "report.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    for path in report.write_chart(search, work_dir / "chart", title):
        console.print(f"wrote {path}")
    if output is not None:
        output.mkdir(parents=True, exist_ok=True)
        console.print(f"wrote {model_config.write(winner, output)}")
    else:
        typer.echo(model_config.to_text(winner), nl=False)
    if all(o.score == 0 for o in search.outcomes):
        raise ToolError("no trial had a step within the budget without errors; raise --p99-ms or lower --concurrency")
