"""The building blocks of the settings schema: how a value given as text is read (a boolean, an integer,
a port range, words of a command line...), the typed fields they make, and :func:`setting`, which
declares one setting with its variables, meaning, default and bounds (docs/settings.md is made from
these declarations)."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Annotated, Any

import annotated_types
from pydantic import AfterValidator, BeforeValidator, Field, JsonValue

from smtriton.serve.errors import StartupError

PORT_MIN, PORT_MAX = 1, 65535
MIB = 1024 * 1024


class SettingsError(StartupError):
    """A setting has a value that cannot be used; `serve` exits with this message."""


# ----- how an environment string becomes a value (other values, from flags or code, pass through) -----


def parse_boolean(value: object) -> object:
    if not isinstance(value, str):
        return value
    word = value.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    if "--" in word:  # native's word-splitting let such a value smuggle flags in (docs/contract.md §6 B17)
        loads = [arg.split("=", 1)[1] for arg in value.split() if arg.startswith("--load-model=")]
        if loads:
            raise ValueError(
                f"is not a boolean: to load {', '.join(loads)} beside the default model, set "
                f"SMTRITON_LOAD_MODELS={','.join(loads)} (or SAGEMAKER_TRITON_ADDITIONAL_ARGS='--load-model=...')"
            )
        raise ValueError("is not a boolean: tritonserver flags go in SAGEMAKER_TRITON_ADDITIONAL_ARGS")
    raise ValueError("is not a boolean (use true or false)")


def parse_names(value: object) -> object:
    """A comma-separated list of names (``*``: every one)."""
    if not isinstance(value, str):
        return value
    return tuple(name.strip() for name in value.split(",") if name.strip())


def parse_exactly_true(value: object) -> object:
    """SageMaker's switches (docs/contract.md §1.3): on iff the value is exactly ``true``; anything else is off."""
    return value == "true" if isinstance(value, str) else value


def parse_integer(value: object) -> object:
    if not isinstance(value, str):
        return value
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError("is not an integer") from None


def parse_number(value: object) -> object:
    if not isinstance(value, str):
        return value
    try:
        return float(value.strip())
    except ValueError:
        raise ValueError("is not a number") from None


def parse_word(change: Callable[[str], str]) -> Callable[[object], object]:
    def convert(value: object) -> object:
        return change(value.strip()) if isinstance(value, str) else value

    return convert


def parse_port_range(value: object) -> object:
    if not isinstance(value, str):
        return value
    low, sep, high = value.strip().partition("-")
    if not sep:
        raise ValueError("must look like LOW-HIGH")
    return (parse_integer(low), parse_integer(high))


def parse_ordered(value: tuple[int, int] | None) -> tuple[int, int] | None:
    if value is not None and value[0] > value[1]:
        raise ValueError("LOW is above HIGH")
    return value


def parse_verbosity(value: object) -> object:
    """Native passes the value to ``--log-verbose``, which takes true, false or a level."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return int(value.strip().lower() == "true")
    return parse_integer(value)


def parse_ping_mode(value: object) -> object:
    """``live`` (any case) selects live mode; any other value means ``ready``, the mode that asks more of
    Triton, so a misspelt value can never make `/ping` report healthy sooner."""
    if isinstance(value, str):
        return "live" if value.strip().lower() == "live" else "ready"
    return value


def parse_shell_words(value: object) -> object:
    if not isinstance(value, str):
        return value
    try:
        return tuple(shlex.split(value))
    except ValueError as exc:
        raise ValueError(f"cannot be split shell-style: {exc}") from None


Boolean = Annotated[bool, BeforeValidator(parse_boolean)]
Switch = Annotated[bool, BeforeValidator(parse_exactly_true)]
Integer = Annotated[int, BeforeValidator(parse_integer)]
Number = Annotated[float, BeforeValidator(parse_number)]
PortNumber = Annotated[int, annotated_types.Interval(ge=PORT_MIN, le=PORT_MAX)]
PortRange = Annotated[tuple[PortNumber, PortNumber], BeforeValidator(parse_port_range), AfterValidator(parse_ordered)]


def setting(
    env: str | tuple[str, ...],
    doc: str,
    default: Any = None,
    *,
    default_factory: Callable[[dict[str, Any]], Any] | None = None,
    shown: str | None = None,
    flag: bool = False,
    option: str | None = None,
    refusal: str | None = None,
    ge: int | None = None,
    gt: float | None = None,
    le: int | None = None,
) -> Any:
    """One setting: its variable (several: the first one set wins), meaning, default and bounds.

    ``shown`` is the default as the docs state it, where the value alone would not say it; ``flag``: a
    `serve` option of the same name overrides it; ``option``: that option's help, where ``doc`` words the
    variable's value rather than the option; ``refusal`` words the start of the error for a bad value
    (``{variable}`` and ``{value}`` are filled in).
    """
    extra: dict[str, JsonValue] = {"env": [env] if isinstance(env, str) else list(env), "flag": flag}
    if option is not None:
        extra["option"] = option
    if shown is not None:
        extra["shown"] = shown
    if refusal is not None:
        extra["refusal"] = refusal
    if default_factory is not None:
        return Field(default_factory=default_factory, description=doc, json_schema_extra=extra, ge=ge, gt=gt, le=le)
    return Field(default, description=doc, json_schema_extra=extra, ge=ge, gt=gt, le=le)
