"""The repository builder without torch: Python-backend models, skip when current, atomic replacement."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from smtriton import model_config
from smtriton.cli import app
from smtriton.convert import build
from smtriton.convert.build import build_repository, replace_dir, staged_dir
from smtriton.demo.triton_models.string_upper import reference, upper

RECIPE = """
[[model]]
name = "upper"
format = "python"
source = "smtriton.demo.triton_models.string_upper"
max_batch_size = 8
input = [{ name = "TEXT", dtype = "BYTES", shape = ["batch", 1] }]
output = [{ name = "UPPER", dtype = "BYTES", shape = ["batch", 1] }]
dynamic_batching = { max_queue_delay_microseconds = 100 }
"""


@pytest.fixture
def recipe(tmp_path) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE)
    return path


def test_python_model_is_built_then_skipped(recipe, tmp_path):
    out = tmp_path / "repo"
    first = build_repository(recipe, out)
    assert [(r.name, r.status) for r in first.results] == [("upper", "built")]
    assert (out / "upper" / "1" / "model.py").read_text().startswith('"""Triton Python-backend model')
    config = model_config.read(out / "upper")
    assert config.backend == "python"
    assert config.max_batch_size == 8

    second = build_repository(recipe, out)
    assert second.up_to_date
    assert [r.status for r in second.results] == ["up to date"]


def test_output_defaults_to_the_recipe_directory(recipe, tmp_path):
    report = build_repository(recipe)
    assert report.output == tmp_path
    assert (tmp_path / "upper" / "config.pbtxt").is_file()


def test_changed_entry_or_deleted_artifact_triggers_rebuild(recipe, tmp_path):
    out = tmp_path / "repo"
    build_repository(recipe, out)
    recipe.write_text(RECIPE.replace("delay_microseconds = 100", "delay_microseconds = 50"))
    assert build_repository(recipe, out).results[0].status == "built"
    assert model_config.read(out / "upper").dynamic_batching.max_queue_delay_microseconds == 50
    (out / "upper" / "1" / "model.py").unlink()
    assert build_repository(recipe, out).results[0].status == "built"
    assert build_repository(recipe, out, force=True).results[0].status == "built"


def test_failed_build_keeps_the_previous_model_and_leaves_no_staging(recipe, tmp_path, monkeypatch):
    out = tmp_path / "repo"
    build_repository(recipe, out)
    before = (out / "upper" / "config.pbtxt").read_text()

    def explode(model_dir: Path, spec, say, *options):
        (model_dir / "half-written").write_text("x")
        raise RuntimeError("exporter crashed")

    monkeypatch.setattr(build, "_build_into", explode)
    report = build_repository(recipe, out, force=True)
    assert not report.ok
    assert "exporter crashed" in (report.results[0].error or "")
    assert (out / "upper" / "config.pbtxt").read_text() == before
    assert not (out / "upper" / "half-written").exists()
    assert [p.name for p in out.iterdir() if p.name.startswith(".") and p.is_dir()] == []


def test_leftovers_of_a_killed_build_are_removed(recipe, tmp_path):
    out = tmp_path / "repo"
    (out / ".upper.tmp-abc123" / "1").mkdir(parents=True)
    (out / ".upper.old-1234").mkdir()
    build_repository(recipe, out)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["upper"]


def test_models_dropped_from_the_recipe_are_removed_but_foreign_dirs_kept(recipe, tmp_path):
    out = tmp_path / "repo"
    build_repository(recipe, out)
    (out / "hand_made").mkdir()
    recipe.write_text(RECIPE.replace('name = "upper"', 'name = "upper2"'))
    report = build_repository(recipe, out)
    assert report.removed == ["upper"]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["hand_made", "upper2"]


def test_staged_dir_replaces_atomically(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "old").write_text("old")
    with staged_dir(tmp_path, "m") as staging:
        assert staging.parent == tmp_path
        assert staging.name.startswith(".m.tmp-")
        assert (staging.stat().st_mode & 0o777) == 0o755
        (staging / "new").write_text("new")
        assert (tmp_path / "m" / "old").exists()  # untouched until the block completes
    assert [p.name for p in (tmp_path / "m").iterdir()] == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_replace_dir_into_empty_place(tmp_path):
    (tmp_path / "new").mkdir()
    replace_dir(tmp_path / "new", tmp_path / "final")
    assert (tmp_path / "final").is_dir()
    assert not (tmp_path / "new").exists()


def test_string_upper_reference_handles_utf8():
    text = np.array([[b"caf\xc3\xa9"], [b"stra\xc3\x9fe"], [b""]], dtype=np.object_)
    assert upper(text).tolist() == [["CAFÉ".encode()], [b"STRASSE"], [b""]]
    assert reference({"TEXT": text})["UPPER"].shape == (3, 1)


def test_cli_reports_up_to_date_and_recipe_errors(recipe, tmp_path):
    runner = CliRunner()
    out = tmp_path / "repo"
    first = runner.invoke(app, ["build-repository", str(recipe), "--output", str(out)])
    assert first.exit_code == 0, first.output
    second = runner.invoke(app, ["build-repository", str(recipe), "--output", str(out)])
    assert second.exit_code == 0
    assert "up to date" in second.output

    bad = tmp_path / "bad.toml"
    bad.write_text(RECIPE.replace('dtype = "BYTES"', 'dtype = "STRING"', 1))
    result = runner.invoke(app, ["build-repository", str(bad)])
    assert result.exit_code == 2
    assert "dtype must be one of" in " ".join(result.output.split())
    bad.write_text(RECIPE + "axes = { sequence = [3] }\n")  # markup-like "[model.axes]" must print as is
    result = runner.invoke(app, ["build-repository", str(bad)])
    assert result.exit_code == 2
    assert "[model.axes] names axes" in result.output
    unknown = runner.invoke(app, ["build-repository", str(recipe), "-m", "nope"])
    assert unknown.exit_code == 2
    assert "no model named 'nope'" in " ".join(unknown.output.split())


# --- ensembles --------------------------------------------------------------------------------------

PIPELINE = (
    RECIPE
    + """
[[model]]
name = "shout"                # upper-cases twice through an intermediate tensor: a two-step pipeline
format = "ensemble"
max_batch_size = 8
input = [{ name = "IN", dtype = "BYTES", shape = ["batch", 1] }]
output = [{ name = "OUT" }]
axes = { batch = [1, 2] }

[[model.step]]
model = "upper"
input_map = { TEXT = "once" }
output_map = { UPPER = "OUT" }

[[model.step]]
model = "upper"
input_map = { TEXT = "IN" }
output_map = { UPPER = "once" }
"""
)
NUMBERS_MODEL = """
[[model]]
name = "post"
format = "python"
source = "post.py"
max_batch_size = 8
input = [{ name = "LOGITS", dtype = "FP32", shape = ["batch", 1000] }]
output = [{ name = "CLASS_IDS", dtype = "INT64", shape = ["batch", 5] }]
"""


@pytest.fixture
def pipeline(tmp_path) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(PIPELINE)
    return path


def test_an_ensemble_is_built_after_its_steps_checked_and_run_against_its_reference(pipeline, tmp_path):
    out = tmp_path / "repo"
    report = build_repository(pipeline, out)
    assert [(r.name, r.status) for r in report.results] == [("upper", "built"), ("shout", "built")]
    config = model_config.read(out / "shout")
    assert config.platform == "ensemble"
    # The output's type and dims come from the step that writes it.
    assert [(o.name, model_config.data_type_name(o.data_type), list(o.dims)) for o in config.output] == [
        ("OUT", "TYPE_STRING", [1])
    ]
    assert [s.model_name for s in config.ensemble_scheduling.step] == ["upper", "upper"]
    assert (out / "shout" / "1").is_dir()
    parity = report.results[1].parity
    assert parity is not None
    assert parity.passed
    assert parity.cases == 2 * 3  # batch sizes x trials
    from smtriton.repo.validate import validate_repository

    assert validate_repository(out) == []
    assert build_repository(pipeline, out).up_to_date


def test_a_changed_step_model_rebuilds_the_ensemble(pipeline, tmp_path):
    out = tmp_path / "repo"
    build_repository(pipeline, out)
    pipeline.write_text(PIPELINE.replace("delay_microseconds = 100", "delay_microseconds = 10"))
    assert [r.status for r in build_repository(pipeline, out).results] == ["built", "built"]


def test_naming_the_ensemble_builds_its_steps_too(pipeline, tmp_path):
    report = build_repository(pipeline, tmp_path / "repo", models=["shout"])
    assert [(r.name, r.status) for r in report.results] == [("upper", "built"), ("shout", "built")]


def test_a_tensor_of_the_wrong_type_fails_the_ensemble_with_one_line(pipeline, tmp_path):
    pipeline.write_text(
        PIPELINE.replace('model = "upper"\ninput_map = { TEXT = "once" }\noutput_map = { UPPER = "OUT" }',
                         'model = "post"\ninput_map = { LOGITS = "once" }\noutput_map = { CLASS_IDS = "OUT" }')
        + NUMBERS_MODEL
    )  # fmt: skip
    (tmp_path / "post.py").write_text("class TritonPythonModel:\n    pass\n")
    report = build_repository(pipeline, tmp_path / "repo")
    result = next(r for r in report.results if r.name == "shout")
    assert result.status == "failed"
    assert result.error is not None
    assert result.error == (
        "model 'shout': ensemble step 1 (post): tensor 'once' is TYPE_STRING [1] (output 'UPPER' of step 2 "
        "(upper)), post input 'LOGITS' is TYPE_FP32 [1000]"
    )
    assert not (tmp_path / "repo" / "shout").exists()


def test_a_pipeline_that_differs_from_its_reference_fails(pipeline, tmp_path, monkeypatch):
    from smtriton.convert import pipeline as pipeline_module

    def lower_case(spec, recipe, output):
        return lambda inputs: {"OUT": np.array([[b"x"]] * len(inputs["IN"]), dtype=np.object_)}

    monkeypatch.setattr(pipeline_module, "artifact_runner", lower_case)
    report = build_repository(pipeline, tmp_path / "repo")
    result = report.results[1]
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.startswith("model 'shout': the built pipeline differs from its eager reference\nparity FAILED")


def test_an_ensemble_whose_step_model_failed_is_not_built(pipeline, tmp_path, monkeypatch):
    real = build._build_into

    def fail_upper(model_dir, spec, *rest):
        if spec.name == "upper":
            raise RuntimeError("broken")
        return real(model_dir, spec, *rest)

    monkeypatch.setattr(build, "_build_into", fail_upper)
    report = build_repository(pipeline, tmp_path / "repo")
    assert [(r.name, r.status, r.error) for r in report.results] == [
        ("upper", "failed", "broken"),
        ("shout", "failed", "model 'shout': built from 'upper', which failed"),
    ]


def test_cli_fails_a_broken_ensemble_with_one_line_and_no_traceback(pipeline, tmp_path):
    pipeline.write_text(PIPELINE.replace('input_map = { TEXT = "IN" }', 'input_map = { TEXT = "INN" }'))
    result = CliRunner().invoke(app, ["build-repository", str(pipeline), "--output", str(tmp_path / "repo")])
    assert result.exit_code == 1
    failed = [line for line in result.output.splitlines() if "failed:" in line]
    assert failed == [
        "shout failed: model 'shout': ensemble step 2 (upper): tensor 'INN' is neither an ensemble input nor "
        "produced by a step; ensemble input 'IN' is read by no step"
    ]
    assert "Traceback" not in result.output
