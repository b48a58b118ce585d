"""perf's outputs: JSON, CSV, the table, and the chart as PNG and self-contained HTML."""

from __future__ import annotations

import csv
import json
import struct
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from smtriton.errors import ToolUsageError
from smtriton.perf import report
from smtriton.perf.cli import parse_loads
from smtriton.perf.stats import StepResult, summarize


def steps() -> list[StepResult]:
    return [
        summarize("concurrency", 1, 2.0, [0.001] * 100, Counter({200: 100}), 0.1, 120),
        summarize("concurrency", 8, 2.0, [0.004] * 400, Counter({200: 400, 503: 3}), 1.9, 500),
        summarize("rate", 300, 2.0, [0.002] * 600, Counter({200: 600}), 0.4, 700, [0.0] * 600),
    ]


def with_a_short_step() -> list[StepResult]:
    """``steps()`` and an open-loop step that offered 500/s and got 250/s answered."""
    short = summarize("rate", 500, 2.0, [0.9] * 1000, Counter({200: 1000}), 0.4, 700, [0.0] * 1000, achieved=500,
                      offered=1000)  # fmt: skip
    return [*steps(), short]


def test_json_and_csv_carry_every_step(tmp_path: Path):
    data = json.loads(report.to_json(with_a_short_step(), {"target": "x"}))
    assert data["target"] == "x"
    assert [s["load"] for s in data["steps"]] == [1, 8, 300, 500]
    assert [(s["offered_rps"], s["short"]) for s in data["steps"][2:]] == [(None, False), (500.0, True)]
    assert data["steps"][1]["errors"] == {"503": 3}
    report.write_csv(with_a_short_step(), tmp_path / "r.csv")
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert [r["mode"] for r in rows] == ["concurrency", "concurrency", "rate", "rate"]
    assert (rows[3]["offered_rps"], rows[3]["short"]) == ("500.0", "True")
    assert rows[1]["errors"] == "503:3"
    assert rows[1]["client_saturated"] == "True"
    assert float(rows[0]["p50_ms"]) == pytest.approx(1.0)


def test_the_table_names_saturated_clients_and_errors():
    console = Console(record=True, width=160)
    console.print(report.table(with_a_short_step(), "t"))
    text = console.export_text()
    rows = {line.split()[0]: line for line in text.splitlines() if line.strip().startswith(("c=", "300/s", "500/s"))}
    assert "95% saturated" in rows["c=8"]
    assert "saturated" not in rows["c=1"]
    assert "503: 3" in rows["c=8"]
    assert "300/s" in text
    assert "short" in rows["500/s"]
    assert "short" not in rows["300/s"]


@pytest.mark.parametrize("width", [160, 80, 60, 40])
def test_the_table_is_never_cut_off_however_narrow_the_terminal(width: int):
    """Every header and every value whole at any width: a wide table, then two-line headers, then a line
    per step; never a value folded or shortened with an ellipsis."""
    results = [
        summarize("concurrency", 1, 2.0, [0.0123] * 100, Counter({200: 100}), 0.5, 100),
        summarize("concurrency", 16, 2.0, [0.11234] * 20000, Counter({200: 20000, 503: 1234, 0: 12}), 1.9, 21000),
        summarize("rate", 400, 2.0, [1.11234] * 800, Counter({200: 800}), 0.5, 800),
    ]
    console = Console(record=True, width=width)
    console.print(report.table(results, "smtriton perf: POST http://127.0.0.1:8080/invocations"))
    text = console.export_text()
    assert "…" not in text
    assert max(len(line.rstrip()) for line in text.splitlines()) <= width
    words = text.split()
    for value in ("10,000", "12.30", "112.34", "1112.34", "503:", "1234", "connection:", "12", "95%", "saturated"):
        assert any(value in word for word in words), (value, text)
    names = ("req/s", "p50", "p90", "p99", "p99.9", "ms", "errors", "client", "CPU")
    if "─" in text:  # a table: every header whole
        names = ("step", *names)
        assert width >= 80  # the widths this table fits at, with two-line headers from 80 columns down
    for name in names:
        assert any(name in word for word in words), (name, text)


def png_pixels(data: bytes) -> np.ndarray:
    """Decode the PNG this module writes (8-bit RGB, filter 0 rows, one IDAT)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    (length,) = struct.unpack(">I", data[33:37])
    assert data[37:41] == b"IDAT"
    raw = zlib.decompress(data[41 : 41 + length])
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(height, 1 + width * 3)
    assert (rows[:, 0] == 0).all()
    return rows[:, 1:].reshape(height, width, 3)


def test_the_png_chart_is_a_valid_image_with_a_marker_per_step(tmp_path: Path):
    paths = report.write_chart(steps(), tmp_path / "c", "p99", "title")
    assert [p.name for p in paths] == ["c.png", "c.html"]
    pixels = png_pixels(paths[0].read_bytes())
    assert pixels.shape == (report.H, report.W, 3)
    xmax, ymax = report._scale(report._points(steps(), "p99"))
    for s in steps():
        x, y = report._xy(s.throughput_rps, s.latency_ms["p99"] or 0.0, xmax, ymax)
        assert tuple(pixels[y, x]) == (31, 119, 180)  # the step's marker


def test_the_html_chart_is_self_contained_with_labelled_points(tmp_path: Path):
    page = report.html_page(steps(), "p50", "a <title>")
    assert page.count("<circle") == 3
    for label in ("c=1", "c=8", "300/s"):
        assert f">{label}</text>" in page
    assert "a &lt;title&gt;" in page
    assert not any(ref in page for ref in ("src=", "href=", "<script"))


def test_lines_join_steps_of_one_kind_only():
    page = report.svg(steps(), "p99", "t")
    assert page.count("<line ") == 1  # c=1 to c=8; not c=8 to the rate step


def test_axis_ends_are_round_numbers():
    assert report.nice_max(3932 * 1.05) == 5000
    assert report.nice_max(11.3) == 12.5
    assert report.nice_max(0.7) == 1.0
    assert report.nice_max(0) == 1.0


def test_load_lists_are_positive_numbers():
    assert parse_loads("1,2, 4", "--concurrency") == [1, 2, 4]
    assert parse_loads("100,250.5", "--rate") == [100, 250.5]
    assert parse_loads(None, "--rate") == []
    for bad, option in (("1,x", "--rate"), ("0,1", "--rate"), ("1.5", "--concurrency")):
        with pytest.raises(ToolUsageError, match=option):
            parse_loads(bad, option)
