"""What a search found, as a table (baseline, every trial, the winner and why) and perf's chart with a
point per trial (no line between them): the step that scored it, labelled with the trial number."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smtriton.perf import report as perf_report
from smtriton.perf.stats import StepResult
from smtriton.tune.knobs import describe
from smtriton.tune.search import Outcome, Search


@dataclass
class TrialPoint(StepResult):
    """A step of a trial, labelled ``t3 c=8`` on the chart and in its table (perf labels it ``c=8``)."""

    trial: int = 0

    @property
    def label(self) -> str:
        return f"t{self.trial} {super().label}"

    @property
    def series(self) -> str:
        """Each trial stands alone: trials are separate configurations, not a sweep to join."""
        return f"t{self.trial}"


def point(outcome: Outcome) -> TrialPoint | None:
    if outcome.step is None:
        return None
    return TrialPoint(**{k: v for k, v in outcome.step.items() if k in StepResult.__dataclass_fields__},
                      trial=outcome.trial)  # fmt: skip


def _p99(step: Mapping[str, Any] | None) -> str:
    value = step["latency_ms"].get("p99") if step else None
    return "-" if value is None else f"{value:.2f}"


def summary(search: Search, p99_ms: float | None) -> str:
    """One sentence: the winner, its throughput under the budget against the baseline's, and the knobs."""
    win, base = search.winner, search.baseline
    assert win is not None
    budget = f"p99 <= {p99_ms:g} ms" if p99_ms is not None else "no latency budget"
    if win is base:
        return f"winner: the baseline ({base.score:,.0f} req/s, {budget}); no change beat it by the margin"
    step = win.step or {}
    win_rps, base_rps = win.score, base.score
    means = ""
    if search.confirmation is not None:  # the mean of every measurement, the fairer comparison
        base_rps, win_rps = (sum(scores) / len(scores) for scores in search.confirmation)
        means = f", means of {len(search.confirmation[0])} measurements each"
    gain = f"{(win_rps / base_rps - 1) * 100:+.0f} %" if base_rps > 0 else "the baseline met no step of it"
    return (
        f"winner: trial {win.trial} ({describe(win.changes)}): {win_rps:,.0f} req/s"
        f" (best step c={step.get('load', 0):g}, p99 {_p99(step)} ms)"
        f" against the baseline's {base_rps:,.0f} req/s ({gain}; {budget}{means})"
    )


def table(search: Search, title: str) -> Any:
    from rich import box
    from rich.table import Table

    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    t.add_column("trial", justify="right")
    t.add_column("changes from the baseline", min_width=38)  # the longest single change, unbroken
    t.add_column("req/s", justify="right")
    t.add_column("at", no_wrap=True)
    t.add_column("p99 ms", justify="right")
    t.add_column("verdict")
    for o in search.outcomes:
        mark = " [bold green](winner)[/]" if o is search.winner else ""
        at = f"c={o.step['load']:g}" if o.step else "-"
        resumed = " [dim](resumed)[/]" if o.resumed else ""
        t.add_row(f"{o.trial}", describe(o.changes), f"{o.score:,.0f}", at, _p99(o.step), o.verdict + mark + resumed)
    return t


def write_chart(search: Search, prefix: Path, title: str) -> list[Path]:
    points = [p for p in (point(o) for o in search.outcomes) if p is not None]
    return perf_report.write_chart(points, prefix, "p99", title)
