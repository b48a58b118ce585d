"""Parity of an exported artifact with the eager model: same fresh random inputs, compared per output.

A floating-point case fails where ``|got - want| > atol + rtol * |want|`` (numpy's ``isclose``). Integer,
boolean and string outputs (class ids, token ids, masks, labels) have no rounding error to allow for:
they must be equal. The report keeps the
largest absolute error, the largest relative error ``|got - want| / max(|want|, atol / rtol)`` (below
that magnitude the absolute tolerance governs, and relative error near zero says nothing; so a max
relative error under ``rtol`` means every element passed on ``rtol`` alone), and which input sizes
produced the worst case.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from smtriton.convert.recipe import ModelSpec
from smtriton.convert.sample_inputs import sample_inputs
from smtriton.errors import ToolError

Runner = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]

_PARITY_STREAM = 7919  # keeps parity inputs apart from the exporters' example inputs


@dataclass
class OutputParity:
    name: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    mismatched: int = 0  # elements outside tolerance, over all cases
    elements: int = 0
    worst_case: str = ""


@dataclass
class ParityReport:
    atol: float
    rtol: float
    cases: int = 0
    outputs: list[OutputParity] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # missing outputs, shape or dtype mismatches

    @property
    def passed(self) -> bool:
        return not self.problems and all(o.mismatched == 0 for o in self.outputs)

    @property
    def max_abs(self) -> float:
        return max((o.max_abs for o in self.outputs), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((o.max_rel for o in self.outputs), default=0.0)

    def summary(self) -> str:
        verdict = "ok" if self.passed else "FAILED"
        lines = [
            f"parity {verdict}: {self.cases} cases, max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g} "
            f"(atol {self.atol:g}, rtol {self.rtol:g})"
        ]
        for o in self.outputs:
            if o.mismatched:
                lines.append(
                    f"  {o.name}: {o.mismatched}/{o.elements} elements out of tolerance, "
                    f"max abs {o.max_abs:.3g} at {o.worst_case}"
                )
        lines += [f"  {p}" for p in self.problems]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ParityReport:
        outputs = [OutputParity(**o) for o in data.get("outputs", [])]
        return cls(data["atol"], data["rtol"], data["cases"], outputs, list(data.get("problems", [])))


class ParityError(ToolError, RuntimeError):
    def __init__(
        self, model: str, report: ParityReport, what: str = "exported artifact differs from the torch model"
    ) -> None:
        super().__init__(f"model {model!r}: {what}\n{report.summary()}")
        self.report = report


def parity_cases(spec: ModelSpec) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    """``trials`` fresh sample inputs for every combination of the recipe's axis sizes."""
    axes = list(spec.axes)
    for combo_index, combo in enumerate(itertools.product(*(spec.axes[a] for a in axes))):
        sizes = dict(zip(axes, combo, strict=True))
        label = ",".join(f"{a}={s}" for a, s in sizes.items()) or "fixed shape"
        for trial in range(spec.parity.trials):
            seed = (_PARITY_STREAM, spec.seed, combo_index, trial)
            yield f"{label} trial {trial}", sample_inputs(spec, sizes, seed)


def compare(
    reference: Runner,
    candidate: Runner,
    cases: Iterable[tuple[str, Mapping[str, np.ndarray]]],
    atol: float,
    rtol: float,
) -> ParityReport:
    report = ParityReport(atol=atol, rtol=rtol)
    per_output: dict[str, OutputParity] = {}
    for label, inputs in cases:
        report.cases += 1
        want_all, got_all = reference(inputs), candidate(inputs)
        for name, want in want_all.items():
            stats = per_output.setdefault(name, OutputParity(name))
            got = got_all.get(name)
            if got is None:
                report.problems.append(f"{name}: missing from the artifact's outputs ({label})")
                continue
            if got.shape != want.shape or got.dtype != want.dtype:
                report.problems.append(
                    f"{name}: artifact gives {got.dtype}{list(got.shape)}, "
                    f"torch {want.dtype}{list(want.shape)} ({label})"
                )
                continue
            _accumulate(stats, np.asarray(want), np.asarray(got), atol, rtol, label)
    report.outputs = list(per_output.values())
    return report


def _accumulate(stats: OutputParity, want: np.ndarray, got: np.ndarray, atol: float, rtol: float, label: str) -> None:
    stats.elements += want.size
    if want.size == 0:
        return
    if want.dtype == np.object_:  # BYTES: exact
        bad = int(np.count_nonzero(want != got))
        stats.mismatched += bad
        if bad and not stats.worst_case:
            stats.worst_case = label
        return
    w, g = want.astype(np.float64), got.astype(np.float64)
    if want.dtype.kind in "biu":  # INTEGER and BOOL: equal or not (compared as integers), the error still measured
        close, atol, rtol = np.asarray(want == got), 0.0, 0.0
    else:
        close = np.isclose(g, w, atol=atol, rtol=rtol, equal_nan=True)
    stats.mismatched += int(np.count_nonzero(~close))
    diff = np.abs(g - w)
    diff[np.isnan(diff) & close] = 0.0  # NaN vs NaN, inf vs the same inf: equal
    max_abs = float(np.nan_to_num(diff, nan=np.inf).max())
    if max_abs > stats.max_abs or not stats.worst_case:
        stats.max_abs, stats.worst_case = max_abs, label
    floor = atol / rtol if rtol > 0 else max(atol, float(np.finfo(np.float64).tiny))
    rel = diff / np.maximum(np.abs(w), floor)
    stats.max_rel = max(stats.max_rel, float(np.nan_to_num(rel, nan=np.inf).max()))
