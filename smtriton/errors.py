"""The base errors of the build-time tools, so that the `smtriton` command catches them in one place.

A :class:`ToolError` is a failure the user can act on; its message is one line saying what went wrong
and what to change. :class:`ToolUsageError` marks the ones caused by what was given (a recipe, a flag,
a config): the command exits 2 for those and 1 for the rest. The runtime's errors live in
:mod:`smtriton.serve.errors`.
"""

from __future__ import annotations


class ToolError(Exception):
    """A build-time tool could not do what was asked."""

    exit_code = 1


class ToolUsageError(ToolError):
    """What the user gave (recipe, flags, config, archive) cannot be used as it is."""

    exit_code = 2
