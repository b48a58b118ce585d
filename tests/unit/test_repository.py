"""SME start-up rules of docs/contract.md §1.5, with native's messages."""

import pytest

from smtriton.serve.owner.startup import RepositoryError, resolve_default_model


def _model(root, name):
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(f'name: "{name}"\n')


def test_single_model_becomes_the_default(tmp_path):
    _model(tmp_path, "only")
    assert resolve_default_model(tmp_path, None) == "only"


def test_named_default_is_used_among_several(tmp_path):
    _model(tmp_path, "a")
    _model(tmp_path, "b")
    assert resolve_default_model(tmp_path, "b") == "b"


def test_several_models_without_a_name_is_an_error(tmp_path):
    _model(tmp_path, "a")
    _model(tmp_path, "b")
    with pytest.raises(RepositoryError, match="More than 1 model directory found in model repository"):
        resolve_default_model(tmp_path, None)


def test_named_default_that_does_not_exist_is_an_error(tmp_path):
    _model(tmp_path, "a")
    _model(tmp_path, "b")
    with pytest.raises(RepositoryError, match=r"MODEL_NAME nope does not exist \(models there: a, b\)$"):
        resolve_default_model(tmp_path, "nope")


def test_empty_repository_is_an_error(tmp_path):
    with pytest.raises(RepositoryError, match="No model found in model repository"):
        resolve_default_model(tmp_path, None)


def test_config_at_the_root_is_an_error(tmp_path):
    (tmp_path / "config.pbtxt").write_text("")
    with pytest.raises(RepositoryError, match="Incorrect directory structure"):
        resolve_default_model(tmp_path, None)


def test_hidden_directories_are_not_models(tmp_path):
    _model(tmp_path, "m")
    (tmp_path / ".cache").mkdir()
    assert resolve_default_model(tmp_path, None) == "m"
