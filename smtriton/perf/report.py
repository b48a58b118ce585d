"""A run's results as a table, JSON, CSV, and a throughput-against-latency chart (PNG and self-contained HTML).

The chart has one point per step, labelled with its concurrency or rate. The PNG is drawn here (numpy
pixels, a 3x5 pixel font, zlib), so no plotting library is needed; the HTML page carries an inline SVG.
"""

from __future__ import annotations

import csv
import html
import json
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from smtriton.perf.stats import PERCENTILES, StepResult, percentile_key

LATENCY_KEYS = [percentile_key(q) for q in PERCENTILES]


def to_json(results: Sequence[StepResult], meta: dict[str, Any]) -> str:
    return json.dumps({**meta, "steps": [r.to_dict() for r in results]}, indent=2)


def csv_rows(results: Sequence[StepResult]) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        row: dict[str, Any] = {
            "mode": r.mode,
            "load": r.load,
            "duration_s": round(r.duration_s, 3),
            "requests": r.requests,
            "ok": r.ok,
            "throughput_rps": round(r.throughput_rps, 2),
            "offered_rps": "" if r.offered_rps is None else round(r.offered_rps, 2),
            "short": r.short,
        }
        for key in LATENCY_KEYS:
            value = r.latency_ms[key]
            row[f"{key}_ms"] = "" if value is None else round(value, 3)
        row["mean_ms"] = "" if r.mean_ms is None else round(r.mean_ms, 3)
        row["errors"] = " ".join(f"{k}:{v}" for k, v in r.errors.items())
        row["client_cpu"] = round(r.client_cpu, 3)
        row["client_saturated"] = r.client_saturated
        row["late"] = r.late
        rows.append(row)
    return rows


def write_csv(results: Sequence[StepResult], path: Path) -> None:
    rows = csv_rows(results)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["mode"])
        writer.writeheader()
        writer.writerows(rows)


class StepTable:
    """The table of a run, laid out for the width it is printed at, never cut off.

    Wide enough: one line per step and per header. Narrower: the headers over two lines ("p99.9" above
    "ms"), the errors one status per line. Narrower still: a line per step, "c=8: 1,234 req/s; ...",
    which the console wraps at its spaces. Cells are never folded or shortened with "…".
    """

    def __init__(self, results: Sequence[StepResult], title: str) -> None:
        self.results = list(results)
        self.title = title

    def _table(self, compact: bool) -> Any:
        from rich import box
        from rich.table import Table

        t = Table(title=self.title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
        t.pad_edge, t.collapse_padding = False, True  # two spaces between columns, none at the edges
        t.add_column("step", no_wrap=True)
        gap = "\n" if compact else " "
        for name in ("req/s", *(f"{k}{gap}ms" for k in LATENCY_KEYS), "errors", f"client{gap}CPU"):
            t.add_column(name, justify="right", no_wrap=True)
        for r in self.results:
            lat = [("-" if r.latency_ms[k] is None else f"{r.latency_ms[k]:.2f}") for k in LATENCY_KEYS]
            errors = ("\n" if compact else ", ").join(f"{k}: {v}" for k, v in r.errors.items()) or "0"
            cpu = f"{r.client_cpu:.0%}" + (f"{gap}[bold red]saturated[/]" if r.client_saturated else "")
            rps = f"{r.throughput_rps:,.0f}" + (f"{gap}[bold red]short[/]" if r.short else "")
            t.add_row(r.label, rps, *lat, f"[red]{errors}[/]" if r.errors else errors, cpu)
        return t

    def _lines(self) -> Any:
        from rich.text import Text

        lines = [self.title]
        for r in self.results:
            lat = "/".join("-" if r.latency_ms[k] is None else f"{r.latency_ms[k]:.2f}" for k in LATENCY_KEYS)
            errors = ", ".join(f"{k}: {v}" for k, v in r.errors.items()) or "0"
            cpu = f"{r.client_cpu:.0%}" + (" saturated" if r.client_saturated else "")
            short = f" (short of {r.offered_rps:,.0f} offered)" if r.short and r.offered_rps is not None else ""
            lines.append(f"{r.label}: {r.throughput_rps:,.0f} req/s{short}; {'/'.join(LATENCY_KEYS)} {lat} ms; "
                         f"errors {errors}; client CPU {cpu}")  # fmt: skip
        return Text("\n".join(lines))

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.measure import Measurement

        for compact in (False, True):
            table = self._table(compact)
            if Measurement.get(console, options.update_width(1 << 16), table).maximum <= options.max_width:
                yield table
                return
        yield self._lines()


def table(results: Sequence[StepResult], title: str) -> StepTable:
    """The run's table for the console (see :class:`StepTable`)."""
    return StepTable(results, title)


# --- chart ---------------------------------------------------------------------------------------------

W, H = 720, 440
LEFT, RIGHT, TOP, BOTTOM = 70, 30, 40, 50


def _charted(results: Sequence[StepResult], key: str) -> list[StepResult]:
    return [r for r in results if r.latency_ms[key]]


def _points(results: Sequence[StepResult], key: str) -> list[tuple[float, float, str]]:
    return [(r.throughput_rps, float(r.latency_ms[key] or 0.0), r.label) for r in _charted(results, key)]


def nice_max(value: float, ticks: int = 5) -> float:
    """The axis end above ``value`` whose ``ticks`` steps are round numbers (1, 2, 2.5 or 5 times 10^k)."""
    if value <= 0:
        return 1.0
    raw = value / ticks
    magnitude = 10.0 ** np.floor(np.log10(raw))
    step = next(m * magnitude for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * magnitude >= raw)
    return float(step * ticks)


def _joined(results: Sequence[StepResult], key: str) -> list[tuple[int, int]]:
    """Index pairs of the charted points joined by a line: consecutive steps of one series (a concurrency
    sweep, a rate sweep), never a concurrency step to a rate step, nor one tune trial to another."""
    series = [r.series for r in _charted(results, key)]
    return [(i, i + 1) for i in range(len(series) - 1) if series[i] == series[i + 1]]


def _scale(points: list[tuple[float, float, str]]) -> tuple[float, float]:
    xmax = max((p[0] for p in points), default=1.0) * 1.05
    ymax = max((p[1] for p in points), default=1.0) * 1.1
    return nice_max(xmax), nice_max(ymax)


def _xy(x: float, y: float, xmax: float, ymax: float) -> tuple[int, int]:
    return (
        int(LEFT + x / xmax * (W - LEFT - RIGHT)),
        int(H - BOTTOM - y / ymax * (H - TOP - BOTTOM)),
    )


def svg(results: Sequence[StepResult], key: str, title: str) -> str:
    pts = _points(results, key)
    xmax, ymax = _scale(pts)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">']
    out.append(f'<rect width="{W}" height="{H}" fill="white"/>')
    out.append(f'<text x="{LEFT}" y="22" font-size="14">{html.escape(title)}</text>')
    x0, y0 = _xy(0, 0, xmax, ymax)
    x1, y1 = _xy(xmax, ymax, xmax, ymax)
    out.append(f'<path d="M{x0},{y1} L{x0},{y0} L{x1},{y0}" stroke="black" fill="none"/>')
    for i in range(6):
        xv, yv = xmax * i / 5, ymax * i / 5
        xt, _ = _xy(xv, 0, xmax, ymax)
        _, yt = _xy(0, yv, xmax, ymax)
        out.append(f'<text x="{xt}" y="{y0 + 16}" text-anchor="middle">{xv:,.0f}</text>')
        out.append(f'<text x="{x0 - 6}" y="{yt + 4}" text-anchor="end">{yv:.3g}</text>')
    out.append(f'<text x="{(x0 + x1) // 2}" y="{H - 12}" text-anchor="middle">throughput (requests/s)</text>')
    out.append(f'<text x="16" y="{(y0 + y1) // 2}" transform="rotate(-90 16 {(y0 + y1) // 2})" '
               f'text-anchor="middle">{key} latency (ms)</text>')  # fmt: skip
    coords = [_xy(x, y, xmax, ymax) for x, y, _ in pts]
    for i, j in _joined(results, key):
        (xa, ya), (xb, yb) = coords[i], coords[j]
        out.append(f'<line x1="{xa}" y1="{ya}" x2="{xb}" y2="{yb}" stroke="#1f77b4" stroke-width="2"/>')
    for (x, y), (tx, ty, label) in zip(coords, pts, strict=True):
        tip = f"{label}: {tx:,.0f} req/s, {key} {ty:.2f} ms"
        out.append(f'<circle cx="{x}" cy="{y}" r="4" fill="#1f77b4"><title>{html.escape(tip)}</title></circle>')
        out.append(f'<text x="{x + 6}" y="{y - 6}">{html.escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def html_page(results: Sequence[StepResult], key: str, title: str) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(r.label)}</td><td>{r.throughput_rps:,.1f}</td>"
        + "".join(f"<td>{'-' if r.latency_ms[k] is None else f'{r.latency_ms[k]:.2f}'}</td>" for k in LATENCY_KEYS)
        + f"<td>{html.escape(', '.join(f'{k}: {v}' for k, v in r.errors.items()) or '0')}</td>"
        + f"<td>{r.client_cpu:.0%}{' saturated' if r.client_saturated else ''}</td></tr>"
        for r in results
    )
    heads = "".join(f"<th>{k} ms</th>" for k in LATENCY_KEYS)
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 10px;text-align:right}</style></head><body>"
        f"{svg(results, key, title)}<table><tr><th>step</th><th>req/s</th>{heads}<th>errors</th>"
        f"<th>client CPU</th></tr>{rows}</table></body></html>\n"
    )


# 3x5 pixel glyphs, rows top to bottom, 3 bits each (4 = left pixel).
FONT = {
    "0": (7, 5, 5, 5, 7), "1": (2, 6, 2, 2, 7), "2": (7, 1, 7, 4, 7), "3": (7, 1, 7, 1, 7), "4": (5, 5, 7, 1, 1),
    "5": (7, 4, 7, 1, 7), "6": (7, 4, 7, 5, 7), "7": (7, 1, 1, 1, 1), "8": (7, 5, 7, 5, 7), "9": (7, 5, 7, 1, 7),
    ".": (0, 0, 0, 0, 2), ",": (0, 0, 0, 2, 4), "=": (0, 7, 0, 7, 0), "/": (1, 1, 2, 4, 4), "c": (0, 7, 4, 4, 7),
    "s": (0, 7, 6, 3, 7), "m": (0, 7, 7, 5, 5), "p": (0, 7, 5, 7, 4), "r": (0, 7, 4, 4, 4), "e": (0, 7, 7, 4, 7),
    "q": (0, 7, 5, 7, 1), "l": (6, 2, 2, 2, 7), "a": (0, 6, 3, 5, 7), "t": (2, 7, 2, 2, 3), " ": (0, 0, 0, 0, 0),
    "n": (0, 6, 5, 5, 5), "y": (0, 5, 7, 1, 7), "o": (0, 7, 5, 5, 7), "u": (0, 5, 5, 5, 7), "i": (2, 0, 2, 2, 2),
    "(": (1, 2, 2, 2, 1), ")": (4, 2, 2, 2, 4), "-": (0, 0, 7, 0, 0), "k": (4, 5, 6, 5, 5),
}  # fmt: skip


def _text(img: np.ndarray, x: int, y: int, text: str, scale: int = 2) -> None:
    for ch in text:
        glyph = FONT.get(ch, FONT[" "])
        for row, bits in enumerate(glyph):
            for col in range(3):
                if bits & (4 >> col):
                    ys, xs = y + row * scale, x + col * scale
                    img[max(ys, 0) : max(ys + scale, 0), max(xs, 0) : max(xs + scale, 0)] = (0, 0, 0)
        x += 4 * scale


def _line(img: np.ndarray, a: tuple[int, int], b: tuple[int, int], color: tuple[int, int, int]) -> None:
    steps = max(abs(b[0] - a[0]), abs(b[1] - a[1]), 1)
    for t in np.linspace(0.0, 1.0, steps + 1):
        x, y = round(a[0] + (b[0] - a[0]) * t), round(a[1] + (b[1] - a[1]) * t)
        img[y - 1 : y + 1, x - 1 : x + 1] = color


def png(results: Sequence[StepResult], key: str) -> bytes:
    """The chart as PNG bytes: axes, ticks with values, the steps joined in order, each labelled."""
    pts = _points(results, key)
    xmax, ymax = _scale(pts)
    img = np.full((H, W, 3), 255, dtype=np.uint8)
    x0, y0 = _xy(0, 0, xmax, ymax)
    x1, y1 = _xy(xmax, ymax, xmax, ymax)
    img[y1:y0, x0 - 1 : x0 + 1] = 0
    img[y0 : y0 + 2, x0:x1] = 0
    for i in range(6):
        xt, _ = _xy(xmax * i / 5, 0, xmax, ymax)
        _, yt = _xy(0, ymax * i / 5, xmax, ymax)
        img[y0 : y0 + 6, xt] = 0
        img[yt, x0 - 6 : x0] = 0
        label = f"{xmax * i / 5:,.0f}"
        _text(img, xt - len(label) * 4, y0 + 10, label)
        label = f"{ymax * i / 5:.3g}"
        _text(img, x0 - 10 - len(label) * 8, yt - 5, label)
    _text(img, (x0 + x1) // 2 - 40, H - 20, "req/s")
    _text(img, 8, TOP - 30, f"{key} latency (ms)")
    coords = [_xy(x, y, xmax, ymax) for x, y, _ in pts]
    blue = (31, 119, 180)
    for i, j in _joined(results, key):
        _line(img, coords[i], coords[j], blue)
    for (x, y), (_, _, label) in zip(coords, pts, strict=True):
        img[max(y - 4, 0) : y + 5, max(x - 4, 0) : x + 5] = blue
        _text(img, x + 8, y - 16, label)
    raw = b"".join(b"\x00" + img[row].tobytes() for row in range(H))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def write_chart(results: Sequence[StepResult], prefix: Path, key: str, title: str) -> list[Path]:
    """PREFIX.png and PREFIX.html; the paths written."""
    png_path, html_path = prefix.with_name(prefix.name + ".png"), prefix.with_name(prefix.name + ".html")
    png_path.write_bytes(png(results, key))
    html_path.write_text(html_page(results, key, title), encoding="utf-8")
    return [png_path, html_path]
