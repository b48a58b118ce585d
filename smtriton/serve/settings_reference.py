"""docs/settings.md, generated from the settings' schema: every variable, its default, bounds and
meaning (`python -m smtriton.serve.settings_reference > docs/settings.md`; a test fails when the page and
the schema differ)."""

from __future__ import annotations

import sys

import annotated_types
from pydantic.fields import FieldInfo

from smtriton.serve.settings import (
    WITHOUT_EFFECT,
    Settings,
    extra_of,
    setting_fields,
    shown_default,
    variables_of,
)


def _bounds(field: FieldInfo) -> str:
    ge = next((m.ge for m in field.metadata if isinstance(m, annotated_types.Ge)), None)
    gt = next((m.gt for m in field.metadata if isinstance(m, annotated_types.Gt)), None)
    le = next((m.le for m in field.metadata if isinstance(m, annotated_types.Le)), None)
    if ge is not None and le is not None:
        return f"{ge} to {le}"
    if ge is not None:
        return f"≥ {ge}"
    if gt is not None:
        return f"> {gt}"
    return ""


def markdown() -> str:
    """docs/settings.md: every variable, its default, bounds and meaning, generated from the schema."""
    rows: dict[bool, list[str]] = {True: [], False: []}
    for path, field in setting_fields(Settings):
        names = variables_of(field)
        meaning = str(field.description)
        if len(names) > 1:
            meaning += "; the first one set wins"
        if extra_of(field).get("flag"):
            meaning += f"; also `--{path[-1].replace('_', '-')}`"
        variables = ", ".join(f"`{name}`" for name in names)
        row = f"| {variables} | {shown_default(field)} | {_bounds(field)} | {meaning} |"
        rows[names[0].startswith("SAGEMAKER_")].append(row)
    header = ["| variable | default | bounds | meaning |", "| --- | --- | --- | --- |"]
    ignored = [f"| `{name}` | {why} |" for name, why in WITHOUT_EFFECT.items()]
    return "\n".join(
        [
            "# Settings",
            "",
            "<!-- Generated from smtriton/serve/settings.py: python -m smtriton.serve.settings_reference"
            " > docs/settings.md -->",
            "",
            "`serve` reads these environment variables once, at start-up; a value it does not understand stops it",
            "with a message naming the variable. An empty value means the variable is not set. Flags of `serve`",
            "(local runs) override the variables they name.",
            "",
            "## SageMaker's variables",
            "",
            "Their meaning is that of SageMaker's Triton container; values are parsed, never word-split into the",
            "Triton command line.",
            "",
            *header,
            *rows[True],
            "",
            "## `serve`'s own",
            "",
            *header,
            *rows[False],
            "",
            "## Accepted, without effect",
            "",
            "Recognised, so that a deployment setting one is not told it is unknown; `serve` logs a warning at",
            "start-up saying why it does nothing.",
            "",
            "| variable | why |",
            "| --- | --- |",
            *ignored,
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args:
        print("usage: python -m smtriton.serve.settings_reference > docs/settings.md", file=sys.stderr)
        return 2
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
