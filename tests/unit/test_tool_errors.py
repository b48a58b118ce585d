"""The build-time tools share one error base: `smtriton` turns any of them into one line and an exit status."""

from __future__ import annotations

import sys

import pytest
import typer

from smtriton import cli
from smtriton.aws.deploy import DeployError
from smtriton.convert.recipe import RecipeError
from smtriton.errors import ToolError, ToolUsageError
from smtriton.model_config import ConfigParseError
from smtriton.repo.package import PackageError


@pytest.mark.parametrize(("error", "status"), [(RecipeError("recipe.toml: bad dtype"), 2), (DeployError("no role"), 1)])
def test_a_tool_error_is_one_line_on_stderr_and_its_exit_status(monkeypatch, capsys, error, status):
    app = typer.Typer(cls=cli.ToolGroup)

    @app.command("fail")
    def failing_command() -> None:
        raise error

    @app.command("other")
    def other_command() -> None:
        """A second command, so that the group keeps its subcommands."""

    monkeypatch.setattr(cli, "app", app)
    monkeypatch.setattr(sys, "argv", ["smtriton", "fail"])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == status
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip().splitlines() == [f"error: {error}"]


def test_tool_errors_keep_their_builtin_bases_for_callers_that_catch_those():
    assert issubclass(RecipeError, ToolUsageError)
    assert issubclass(RecipeError, ValueError)
    assert issubclass(PackageError, ToolUsageError)
    assert issubclass(ConfigParseError, ToolUsageError)
    assert issubclass(DeployError, ToolError)
    assert not issubclass(DeployError, ToolUsageError)
    assert issubclass(DeployError, RuntimeError)
