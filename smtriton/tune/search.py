"""The search: score a trial from its raw step figures, keep every trial in ``trials.jsonl``, and walk the
knobs one at a time from the baseline (coordinate descent) within a trial budget.

Pure apart from the store's files, so the decisions are unit-tested with made-up measurements. The
score is computed from the stored raw figures each time, so a rerun with another ``--p99-ms`` re-decides
without re-measuring.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smtriton.errors import ToolUsageError
from smtriton.model_config import ModelConfig
from smtriton.tune.knobs import Changes, Knob, apply, key

TRIALS_FILE = "trials.jsonl"
SETTINGS_FILE = "settings.json"

Record = dict[str, Any]  # one line of trials.jsonl: changes, every step's raw figures, error, seconds


def record_score(record: Record, p99_ms: float | None) -> tuple[float, Mapping[str, Any] | None]:
    """A trial's score; a trial whose serve did not start scores nothing."""
    if record.get("error"):
        return 0.0, None
    return score(record["steps"], p99_ms)


def score(steps: list[Mapping[str, Any]], p99_ms: float | None) -> tuple[float, Mapping[str, Any] | None]:
    """The best throughput among the steps with no error and p99 within the budget, and that step;
    (0, None) when no step qualifies (a configuration that cannot meet the budget is worth nothing)."""
    best: Mapping[str, Any] | None = None
    for step in steps:
        if step["errors"] or not step["ok"]:
            continue
        p99 = step["latency_ms"].get("p99")
        if p99_ms is not None and (p99 is None or p99 > p99_ms):
            continue
        if best is None or step["throughput_rps"] > best["throughput_rps"]:
            best = step
    return (float(best["throughput_rps"]) if best else 0.0), best


def record_key(changes: Changes, repeat: int = 0) -> str:
    """A trial's key in the store: the candidate's, and ``#N`` for its N-th re-measurement."""
    return key(changes) + (f"#{repeat}" if repeat else "")


class TrialStore:
    """``WORK_DIR/trials.jsonl``, a line per measured trial, appended as each ends (a killed run keeps
    what it measured), and ``settings.json``: the load a trial was measured with. Measurements taken
    under another load are not comparable, so a work dir refuses a run with different settings."""

    def __init__(self, work_dir: Path, settings: Mapping[str, Any]) -> None:
        self.work_dir = work_dir
        work_dir.mkdir(parents=True, exist_ok=True)
        settings_path = work_dir / SETTINGS_FILE
        wanted = json.loads(json.dumps(dict(settings)))
        if settings_path.exists():
            earlier = json.loads(settings_path.read_text(encoding="utf-8"))
            if earlier != wanted:
                changed = sorted(k for k in {*earlier, *wanted} if earlier.get(k) != wanted.get(k))
                raise ToolUsageError(
                    f"{work_dir} holds trials measured with other settings ({', '.join(changed)}): "
                    "use another --work-dir, or the same settings to resume"
                )
        else:
            settings_path.write_text(json.dumps(wanted, indent=2) + "\n", encoding="utf-8")
        self.path = work_dir / TRIALS_FILE
        self.records: dict[str, Record] = {}  # a key measured again (after a failure): its last record
        self.measured = 0  # lines in the file: every serve run, retries included
        if self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    record = json.loads(line)
                    self.records[record["key"]] = record
                    self.measured += 1

    def get(self, changes: Changes, repeat: int = 0) -> Record | None:
        return self.records.get(record_key(changes, repeat))

    def add(self, record: Record) -> None:
        self.records[record["key"]] = record
        self.measured += 1
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


@dataclass
class Outcome:
    """One trial in the search: its record, its score under the budget, and what the search made of it."""

    trial: int
    changes: dict[str, Any]
    record: Record
    score: float
    step: Mapping[str, Any] | None
    resumed: bool
    verdict: str = ""


@dataclass
class Search:
    outcomes: list[Outcome] = field(default_factory=list)
    winner: Outcome | None = None
    stopped_by_budget: bool = False
    # Every score of the baseline and the search's winner, first measurement first: (baseline, winner).
    confirmation: tuple[list[float], list[float]] | None = None
    confirmed: bool = True

    @property
    def baseline(self) -> Outcome:
        return self.outcomes[0]


# (changes, repeat) -> (record, True when read from the store); repeat 0 is a candidate's first measurement.
Measure = Callable[[dict[str, Any], int], tuple[Record, bool]]


def _gain(new: float, old: float) -> str:
    return f"{(new / old - 1) * 100:+.0f} %" if old > 0 else "from nothing under the budget"


def _verdict(outcome: Outcome, best: Outcome | None, incumbent: Outcome, min_gain: float) -> str:
    """Why a trial was kept or not, against the incumbent it tried to beat and the best value of its knob."""
    if outcome.record.get("error"):
        return f"failed: {outcome.record['error'].splitlines()[0][:80]}"
    if outcome.score == 0:
        return "no step within the budget"
    gain = _gain(outcome.score, incumbent.score)
    beats = outcome.score > incumbent.score * (1 + min_gain)
    if outcome is best and beats:
        return f"kept: {gain} over trial {incumbent.trial}"
    if beats and best is not None:
        return f"not kept: {gain} over trial {incumbent.trial}, but trial {best.trial} did better"
    if outcome.score > incumbent.score:
        return f"not kept: {gain} over trial {incumbent.trial}, within the {min_gain:.0%} margin"
    return f"not kept: {gain} against trial {incumbent.trial}"


def coordinate_descent(
    baseline: ModelConfig,
    knobs: list[Knob],
    measure: Measure,
    *,
    p99_ms: float | None,
    max_trials: int,
    min_gain: float,
) -> Search:
    """Trial 0 is the baseline; then each knob in turn tries its other values on top of the incumbent,
    and the best of them is kept only if it beats the incumbent by more than ``min_gain`` (a relative
    margin above the run-to-run noise); otherwise the knob stays as it was. At most ``max_trials``."""
    search = Search()

    def run(changes: dict[str, Any]) -> Outcome:
        record, resumed = measure(changes, 0)
        value, step = record_score(record, p99_ms)
        outcome = Outcome(len(search.outcomes), changes, record, value, step, resumed)
        search.outcomes.append(outcome)
        return outcome

    incumbent = run({})
    incumbent.verdict = "baseline" if incumbent.score > 0 else "baseline: no step within the budget"
    for knob in knobs:
        current = apply(baseline, incumbent.changes, knobs)
        best: Outcome | None = None
        tried: list[Outcome] = []
        for value in knob.values:
            if value == knob.read(current):
                continue
            changes = {**incumbent.changes, knob.name: value}
            if value == knob.read(baseline):
                del changes[knob.name]  # back to the baseline's own value: the config names no change
            if apply(baseline, changes, knobs) == current:
                continue  # a change with no effect here (preferred sizes with the batcher off)
            if len(search.outcomes) >= max_trials:
                search.stopped_by_budget = True
                break
            outcome = run(changes)
            tried.append(outcome)
            if best is None or outcome.score > best.score:
                best = outcome
        for outcome in tried:
            outcome.verdict = _verdict(outcome, best, incumbent, min_gain)
        if best is not None and best.verdict.startswith("kept"):
            incumbent = best
        if search.stopped_by_budget:
            break
    search.winner = incumbent
    return search


def confirm(search: Search, measure: Measure, *, p99_ms: float | None, min_gain: float, repeats: int = 2) -> None:
    """Measure the baseline and the winner ``repeats`` more times, in turns (so a drift of the host
    touches both alike), and keep the winner only if the mean of its scores still beats the baseline's
    mean by ``min_gain``: a single short measurement can be lucky."""
    win, base = search.winner, search.baseline
    if win is None or win is base or repeats < 1:
        return
    base_scores, win_scores = [base.score], [win.score]
    for repeat in range(1, repeats + 1):
        for outcome, scores in ((base, base_scores), (win, win_scores)):
            scores.append(record_score(measure(outcome.changes, repeat)[0], p99_ms)[0])
    search.confirmation = (base_scores, win_scores)
    mean_base, mean_win = sum(base_scores) / len(base_scores), sum(win_scores) / len(win_scores)
    if mean_win <= mean_base * (1 + min_gain):
        search.confirmed = False
        win.verdict += f"; not confirmed (mean {mean_win:,.0f} against the baseline's {mean_base:,.0f} req/s)"
        search.winner = base
