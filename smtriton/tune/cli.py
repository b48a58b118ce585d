"""`smtriton tune`: the configuration of a model with the most throughput under a latency budget."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from smtriton import model_config
from smtriton.cli_options import BatchSizeOpt, DurationOpt, InputSeedOpt, ShapeOpt, WarmupOpt
from smtriton.errors import ToolError, ToolUsageError
from smtriton.model_config import ModelConfig
from smtriton.perf.bodies import Body, build_bodies, parse_shapes
from smtriton.perf.cli import parse_loads
from smtriton.perf.runner import StepPlan
from smtriton.serve.host.gpu import gpu_models
from smtriton.serve.triton.tensorrt_check import is_tensorrt
from smtriton.tune import report
from smtriton.tune.engines import PlanBuilder, served_batch_limit
from smtriton.tune.knobs import Knob, apply, describe, key, knobs_for
from smtriton.tune.search import Search, TrialStore, confirm, coordinate_descent, record_key
from smtriton.tune.trial import measure, new_record

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
    warmup: WarmupOpt = 1.0,
    duration: DurationOpt = 3.0,
    shape: ShapeOpt = None,
    batch_size: BatchSizeOpt = 1,
    seed: InputSeedOpt = 0,
    confirm_winner: Annotated[
        bool, typer.Option("--confirm/--no-confirm", help="Measure the baseline and the winner again")
    ] = True,
    onnx: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            "--onnx",
            help="TensorRT plan models: the ONNX file the plan was built from. Precision and the batch size "
            "the plan is optimised for are then searched too, each candidate plan built here (TensorRT, GPU)",
        ),
    ] = None,
    repeats: Annotated[
        int, typer.Option(min=1, help="How many times --confirm measures each of them again, in turns")
    ] = 2,
) -> None:
    """Serve a model with candidate configurations and keep the one with most throughput under --p99-ms.

    Each trial serves the model locally (serve and Triton) with one candidate config.pbtxt and measures
    it with perf's engine. The search starts from the model's own config (trial 0) and tries one knob at
    a time: instance count, dynamic batching and its queue delay, max batch size, preferred batch sizes,
    and the backend's own (ONNX Runtime threads and graph optimisation; PyTorch INFERENCE_MODE,
    DISABLE_OPTIMIZED_EXECUTION, ENABLE_JIT_EXECUTOR and ENABLE_JIT_PROFILING; TensorRT CUDA graphs, and
    with --onnx precision and the profile's
    optimal batch size); on a GPU host, CPU against GPU instances too. A change is kept only if it beats
    the incumbent by --min-gain.
    """
    try:
        baseline = model_config.read(model_dir)
    except OSError as exc:
        raise ToolUsageError(f"{model_dir}: no readable config.pbtxt ({exc.strerror or exc})") from None
    if model_config.is_ensemble(baseline):
        raise ToolUsageError(f"{model_dir}: an ensemble runs no model of its own; tune the models it calls")
    levels = parse_loads(concurrency, "--concurrency")
    shapes = parse_shapes(shape or [])
    bodies = build_bodies(model_dir=model_dir, input_files=[], batch_size=batch_size, shapes=shapes,
                          binary=True, seed=seed)  # fmt: skip
    builder = _plan_builder(model_dir, baseline, onnx, work_dir)
    knobs = _search_space(model_dir, baseline, builder, max_instances, batch_size)
    settings = {"model": model_config.served_name(baseline, model_dir), "baseline": model_config.to_text(baseline),
                "concurrency": levels, "warmup": warmup, "duration": duration, "batch_size": batch_size,
                "shapes": shapes, "seed": seed}  # fmt: skip
    if builder is not None:  # the plans' source is part of what was measured (absent: work dirs stay resumable)
        settings["onnx"] = builder.onnx_sha256
    trials = Trials(model_dir, baseline, knobs, builder, TrialStore(work_dir, settings), bodies,
                    [StepPlan("concurrency", c, warmup, duration) for c in levels])  # fmt: skip

    search = coordinate_descent(baseline, knobs, trials, p99_ms=p99_ms, max_trials=max_trials, min_gain=min_gain)
    if confirm_winner:
        confirm(search, trials, p99_ms=p99_ms, min_gain=min_gain, repeats=repeats)
    assert search.winner is not None
    title = f"smtriton tune: {settings['model']}" + (f", p99 <= {p99_ms:g} ms" if p99_ms is not None else "")
    line = _print_search(search, title, p99_ms, max_trials)
    winner, build = PlanBuilder.split(apply(baseline, search.winner.changes, knobs))
    model_config.write(winner, work_dir)
    summary = {"winner": search.winner.trial, "changes": search.winner.changes, "summary": line, "p99_ms": p99_ms,
               "trials": [{"trial": o.trial, "key": key(o.changes), "score_rps": o.score, "verdict": o.verdict,
                           "step": o.step, "resumed": o.resumed} for o in search.outcomes],
               "confirmation": search.confirmation, "confirmed": search.confirmed}  # fmt: skip
    (work_dir / "report.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    for path in report.write_chart(search, work_dir / "chart", title):
        console.print(f"wrote {path}")
    winning_plan = builder.plan_for(winner, build) if builder is not None else None
    if winning_plan is not None and winning_plan.rebuilt:
        console.print(f"the winner serves a rebuilt plan: {winning_plan.plan} (and its sidecar)", highlight=False)
    if output is not None:
        output.mkdir(parents=True, exist_ok=True)
        console.print(f"wrote {model_config.write(winner, output)}")
        if builder is not None and winning_plan is not None:
            for path in builder.copy_into(winning_plan, output):
                console.print(f"wrote {path}")
    else:
        typer.echo(model_config.to_text(winner), nl=False)
    if all(o.score == 0 for o in search.outcomes):
        raise ToolError("no trial had a step within the budget without errors; raise --p99-ms or lower --concurrency")


def _plan_builder(model_dir: Path, baseline: ModelConfig, onnx: Path | None, work_dir: Path) -> PlanBuilder | None:
    if onnx is None:
        return None
    if not is_tensorrt(baseline, model_dir):
        raise ToolUsageError("--onnx is for TensorRT plan models: it names the ONNX file their plan was built from")
    return PlanBuilder(model_dir, baseline, onnx, work_dir)


def _search_space(
    model_dir: Path, baseline: ModelConfig, builder: PlanBuilder | None, max_instances: int, batch_size: int
) -> list[Knob]:
    """The knobs for this model on this host, without max_batch_size values that would refuse every
    request (below --batch-size) or that the served plan cannot take (above its profile, no --onnx)."""
    knobs = knobs_for(baseline, max_instances, gpu=bool(gpu_models()))
    if builder is not None:
        knobs = builder.knobs(baseline) + knobs  # precision first: every later trial builds on its plan
    largest = served_batch_limit(model_dir, baseline) if builder is None else None
    return [
        replace(k, values=tuple(v for v in k.values if batch_size <= v <= (largest or v)))
        if k.name == "max_batch_size"
        else k
        for k in knobs
    ]


@dataclass
class Trials:
    """The search's measure: a candidate's record from the store, or served and measured now (after
    building the plan it needs, for TensorRT knobs) and stored."""

    model_dir: Path
    baseline: ModelConfig
    knobs: list[Knob]
    builder: PlanBuilder | None
    store: TrialStore
    bodies: list[Body]
    plans: list[StepPlan]

    def __call__(self, changes: dict[str, Any], repeat: int) -> tuple[dict[str, Any], bool]:
        name = describe(changes) + (f" (again, #{repeat})" if repeat else "")
        found = self.store.get(changes, repeat)
        if found is not None and not found["error"]:
            console.print(f"trial {name}: measured before, resumed from {self.store.path}")
            return found, True
        if found is not None:  # what kept serve from starting may be fixed by now: try again
            console.print(f"trial {name}: failed before ({found['error'].splitlines()[0][:100]}), trying again")
        config, build = PlanBuilder.split(apply(self.baseline, changes, self.knobs))
        console.print(f"trial {name}: serving and measuring {len(self.plans)} steps ...")
        folder = self.store.work_dir / "trials" / str(self.store.measured)
        try:
            files = self._plan_files(config, build)
        except ToolError as exc:  # TensorRT refused this precision or profile: the trial scores nothing
            record = {**new_record(record_key(changes, repeat), changes, config), "steps": [],
                      "error": f"TensorRT build failed: {exc}"}  # fmt: skip
        else:
            record = measure(self.model_dir, config, changes, folder, self.bodies, self.plans,
                             record_key(changes, repeat), files)  # fmt: skip
        self.store.add(record)
        if record["error"]:
            console.print(f"  [yellow]no measurement with this config[/]: {record['error'].splitlines()[0]}")
        else:
            best = max(record["steps"], key=lambda s: s["throughput_rps"])
            console.print(f"  {best['throughput_rps']:,.0f} req/s at c={best['load']:g} (any latency)")
        return record, False

    def _plan_files(self, config: ModelConfig, build: dict[str, str]) -> dict[str, Path]:
        """The plan a candidate serves in place of the served one (built now unless built before)."""
        if self.builder is None:
            return {}
        if self.builder.needs_build(config, build):
            wanted = ", ".join(f"{k}={v}" for k, v in build.items()) or f"max_batch_size={config.max_batch_size}"
            console.print(f"  a TensorRT plan for {wanted} ...", highlight=False)
        built = self.builder.plan_for(config, build)
        if built.seconds:
            console.print(f"  built in {built.seconds:.0f} s: {built.plan}", highlight=False)
        return self.builder.files(built)


def _print_search(search: Search, title: str, p99_ms: float | None, max_trials: int) -> str:
    """The table, the winner's line (returned), the confirmation's figures and a budget warning."""
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
    return line
