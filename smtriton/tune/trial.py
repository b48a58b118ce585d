"""One trial: the model in a scratch repository with the candidate's config, served by `serve`
(:class:`ServeProcess`), loaded by the perf engine, stopped; the raw figures of every step kept."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from smtriton import model_config
from smtriton.local.serve_process import ServeProcess
from smtriton.model_config import ModelConfig
from smtriton.perf.bodies import Body
from smtriton.perf.runner import StepPlan, run
from smtriton.perf.targets import HttpTarget

START_TIMEOUT_S = 180.0


def scratch_repository(
    model_dir: Path, config: ModelConfig, repo: Path, files: Mapping[str, Path] | None = None
) -> Path:
    """``repo/<name>/``: every entry of ``model_dir`` symlinked (the weights are never copied) and the
    candidate's config.pbtxt written through the protobuf. ``files`` (``1/model.plan`` -> a file) take
    the place of those entries of a version folder: a plan rebuilt for the trial. Returns the model folder."""
    name = model_config.served_name(config, model_dir)
    if repo.exists():
        shutil.rmtree(repo)
    target = repo / name
    target.mkdir(parents=True)
    files = dict(files or {})
    for entry in model_dir.resolve().iterdir():
        if entry.name == model_config.CONFIG_FILE or entry.name.startswith("."):
            continue
        if not any(k.startswith(entry.name + "/") for k in files):
            (target / entry.name).symlink_to(entry)
            continue
        (target / entry.name).mkdir()
        for child in entry.iterdir():
            if f"{entry.name}/{child.name}" not in files:
                (target / entry.name / child.name).symlink_to(child)
    for relative, source in files.items():
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        (target / relative).symlink_to(source.resolve())
    model_config.write(config, target)
    return target


def serve_env(scratch: Path) -> dict[str, str]:
    """This environment without SageMaker or serve settings (they would change what is measured), serve's
    own scratch inside the trial's folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))}
    env["SMTRITON_WORK_DIR"] = str(scratch)
    return env


def new_record(key: str, changes: dict[str, Any], config: ModelConfig) -> dict[str, Any]:
    """A trials.jsonl record before it is measured: the candidate and the config Triton is given."""
    return {"key": key, "changes": changes, "config": model_config.to_text(config)}


def measure(
    model_dir: Path,
    config: ModelConfig,
    changes: dict[str, Any],
    trial_dir: Path,
    bodies: Sequence[Body],
    plans: list[StepPlan],
    record_key: str,
    files: Mapping[str, Path] | None = None,
) -> dict[str, Any]:
    """Serve the candidate and run the steps; the trials.jsonl record (with ``error`` when serve did
    not start or Triton could not load the model, e.g. a configuration it refuses)."""
    started = time.monotonic()
    trial_dir.mkdir(parents=True, exist_ok=True)
    folder = scratch_repository(model_dir, config, trial_dir / "repo", files)
    serve_work = trial_dir / "serve-work"
    serve_work.mkdir(exist_ok=True)
    name = folder.name
    record = new_record(record_key, changes, config)
    server = ServeProcess(
        ["--model-repository", str(folder.parent), "--default-model", name],
        trial_dir / "serve.log",
        env=serve_env(serve_work),
    )
    try:
        try:
            server.wait_healthy(START_TIMEOUT_S, models=[name])
        except (RuntimeError, TimeoutError) as exc:
            record.update(steps=[], error=str(exc)[-2000:])
            return record
        steps = run(HttpTarget(server.url, bodies, None), plans)
        record.update(steps=[s.to_dict() for s in steps], error=None)
    finally:
        server.stop()
        record["seconds"] = round(time.monotonic() - started, 2)
    return record
