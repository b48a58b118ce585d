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
