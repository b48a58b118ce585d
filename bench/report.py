"""The benchmark's tables: rich on the terminal, Markdown for the README."""

from __future__ import annotations

import shutil
import statistics
from collections.abc import Iterable

from rich.console import Console
from rich.table import Table

console = Console(highlight=False, width=max(shutil.get_terminal_size((200, 50)).columns, 160))

# docs/design.md §6: ours/anchor throughput at c=16, per scenario.
THROUGHPUT_TARGETS = {
    "tiny_json": 0.6,
    "tiny_octet": 0.6,
    "tiny_binary": 0.6,
    "image_binary": 1.05,
    "image_json": 1.2,
    "text_binary": 1.1,
}
# docs/design.md §6: ours' p50 over the anchor's at c=1, per scenario that has a budget.
P50_BUDGETS_MS = {"tiny_json": 0.3, "tiny_octet": 0.3, "tiny_binary": 0.3, "image_binary": 0.5}
COLD_BUDGET_S = 0.5
SERVER_ORDER = {"anchor": 0, "ours": 1, "ours-unmerged": 2, "proxy": 3}
# The front workers' targets (docs/design.md §6): on a small host, the default count is never more than
# 5 % below one worker; on a host with this many CPUs, tiny tensors scale to 4x one worker and the anchor.
WORKERS_SMALL_FLOOR = 0.95
WORKERS_LARGE_HOST_CPUS = 16
WORKERS_LARGE_GAIN = 4.0
WORKERS_LARGE_VS_ANCHOR = 1.0
WORKER_MEMORY_BUDGET_MIB = 60.0


def workers_of(server: str) -> int | None:
    """N for the server ``ours-w<N>`` (serve with N front workers)."""
    count = server.removeprefix("ours-w")
    return int(count) if server.startswith("ours-w") and count.isdigit() else None


LEGEND = (
    "CPU ms/req: CPU time per request of the Python front (serve / the proxy; - for the anchor, whose front is "
    "inside Triton) and of tritonserver with its Python backend stubs. wrk CPU: the load generator's share of one "
    "core. others' CPU: cores other processes on the machine kept busy during the row (* = still above the "
    "threshold after the re-measurements). Triton batch: the mean rows an execution of the model ran, from "
    "Triton's statistics over the row (inferences / executions), and after the slash the requests Triton "
    "answered per client request (below 1 where the front merged requests)."
)


def progress(row: dict[str, object]) -> None:
    console.print(
        f"  {row['server']:>6} {row['scenario']:<13} c={row['connections']:<3} {row['throughput']:>9,.0f} req/s  "
        f"p50 {row['p50_ms']:.2f} ms  p99 {row['p99_ms']:.2f} ms  errors {row['errors']}  "
        f"wrk CPU {row['wrk_cpu']:.0%}  others' CPU {row['other_cpu']:.2f} cores  load {row['loadavg_before'][0]:.2f}"
        f"  Triton batch {triton_batch(row)}  (attempt {row['attempts']})"
    )


def triton_batch(row: dict) -> str:
    """The mean rows an execution ran behind this server, and Triton requests per client request."""
    batch, requests = row.get("triton_batch"), row.get("triton_requests")
    if batch is None:
        return "—"
    return f"{batch:.2f} / {_fmt(requests, '.2f')}"


def _index(rows: Iterable[dict]) -> dict[tuple[str, int, str], dict]:
    return {(r["scenario"], r["connections"], r["server"]): r for r in rows}


def _ratio(a: dict | None, b: dict | None) -> float | None:
    if not a or not b or "throughput" not in a or "throughput" not in b or not b["throughput"]:
        return None
    return a["throughput"] / b["throughput"]


def _fmt(value: float | None, spec: str, none: str = "—") -> str:
    return none if value is None else format(value, spec)


def table_rows(results: dict) -> list[list[str]]:
    rows = results.get("rows", [])
    index = _index(rows)
    keys = sorted({(r["scenario"], r["connections"]) for r in rows}, key=lambda k: (_order(results, k[0]), k[1]))
    out = []
    for scenario, c in keys:
        for server in sorted({r["server"] for r in rows}, key=lambda k: (SERVER_ORDER.get(k, 3), k)):
            r = index.get((scenario, c, server))
            if r is None:
                continue
            if "wrong_answer" in r:
                out.append([scenario, str(c), server, "wrong answer", "", "", "", "", "", "", "", "", "", "", ""])
                continue
            ours = server not in ("anchor", "proxy")  # ours, ours-unmerged and ours-w<N>
            anchor = index.get((scenario, c, "anchor"))
            dp50 = r["p50_ms"] - anchor["p50_ms"] if ours and anchor and "p50_ms" in anchor else None
            out.append(
                [
                    scenario,
                    str(c),
                    server,
                    f"{r['throughput']:,.0f}",
                    f"{r['p50_ms']:.2f}",
                    f"{r['p90_ms']:.2f}",
                    f"{r['p99_ms']:.2f}",
                    str(r["errors"] + r.get("warmup_errors", 0)),
                    _fmt(_ratio(r, anchor) if ours else None, ".2f"),
                    _fmt(_ratio(r, index.get((scenario, c, "proxy"))) if ours else None, ".1f"),
                    _fmt(dp50, "+.2f"),
                    f"{_fmt(r['front_cpu_ms'], '.2f', '-')} / {r['triton_cpu_ms']:.2f}",
                    triton_batch(r),
                    f"{r['wrk_cpu']:.0%}",
                    f"{r['other_cpu']:.2f}" + ("*" if r.get("noisy") else ""),
                ]
            )
    return out


HEADERS = [
    "scenario",
    "c",
    "server",
    "req/s",
    "p50 ms",
    "p90 ms",
    "p99 ms",
    "errors",
    "xanchor",
    "xproxy",
    "p50 -anchor",
    "CPU ms/req front/Triton",
    "Triton batch / req per req",
    "wrk CPU",
    "others' CPU",
]


WORKER_HEADERS = ["scenario", "c", "workers", "req/s", "x 1 worker", "xanchor", "p50 ms", "p99 ms", "front CPU ms/req"]


def worker_rows(results: dict) -> list[list[str]]:
    """serve with 1, 2, ... front workers beside the anchor, per scenario and concurrency."""
    rows = [r for r in results.get("rows", []) if "throughput" in r]
    index = _index(rows)
    counts = sorted({n for r in rows if (n := workers_of(r["server"])) is not None})
    keys = sorted({(r["scenario"], r["connections"]) for r in rows}, key=lambda k: (_order(results, k[0]), k[1]))
    out = []
    for scenario, c in keys:
        one, anchor = index.get((scenario, c, "ours-w1")), index.get((scenario, c, "anchor"))
        for n in counts:
            r = index.get((scenario, c, f"ours-w{n}"))
            if r is None:
                continue
            out.append(
                [
                    scenario,
                    str(c),
                    str(n),
                    f"{r['throughput']:,.0f}",
                    _fmt(_ratio(r, one), ".2f"),
                    _fmt(_ratio(r, anchor), ".2f"),
                    f"{r['p50_ms']:.2f}",
                    f"{r['p99_ms']:.2f}",
                    _fmt(r.get("front_cpu_ms"), ".3f"),
                ]
            )
    return out


def worker_memory(results: dict) -> dict[str, float]:
    """Resident memory one more front worker costs, MiB: the growth of the front's proportional set
    size (shared pages split between their users) from 1 to N workers, divided by N - 1; the largest
    over the models served."""
    by_model: dict[str, dict[int, float]] = {}
    for m in results.get("memory", []):
        n = workers_of(m["server"])
        if n is not None:
            by_model.setdefault(m["model"], {})[n] = m["pss_mib"]
    out: dict[str, float] = {}
    for sizes in by_model.values():
        for n, pss in sizes.items():
            if n > 1 and 1 in sizes:
                key = f"{n} workers"
                out[key] = max(out.get(key, 0.0), (pss - sizes[1]) / (n - 1))
    return out


def worker_targets(results: dict) -> list[list[str]]:
    """The front workers' targets against this run (docs/design.md §6), for this host's size."""
    rows = [r for r in results.get("rows", []) if "throughput" in r]
    index = _index(rows)
    machine = results.get("machine", {})
    cpus = int(machine.get("cpus_available") or machine.get("cores") or 1)
    default = int(machine.get("default_workers") or 1)
    out = []
    keys = sorted({(r["scenario"], r["connections"]) for r in rows}, key=lambda k: (_order(results, k[0]), k[1]))
    if cpus < WORKERS_LARGE_HOST_CPUS:
        for scenario, c in keys:
            ratio = _ratio(index.get((scenario, c, f"ours-w{default}")), index.get((scenario, c, "ours-w1")))
            if ratio is not None:
                floor = WORKERS_SMALL_FLOOR
                out.append([f"{scenario} c={c}: {default} (default) / 1 worker", f"≥ {floor:g}x", f"{ratio:.2f}x",
                            _met(ratio >= floor)])  # fmt: skip
        for scenario in ("tiny_json", "tiny_octet", "tiny_binary"):
            ratio = _ratio(index.get((scenario, 16, f"ours-w{default}")), index.get((scenario, 16, "anchor")))
            if ratio is not None:
                target = THROUGHPUT_TARGETS[scenario]
                out.append([f"{scenario} c=16: {default} worker(s) / anchor", f"≥ {target:g}x", f"{ratio:.2f}x",
                            _met(ratio >= target)])  # fmt: skip
    else:
        top = max((r["connections"] for r in rows), default=16)
        for scenario in ("tiny_json", "tiny_octet", "tiny_binary"):
            best = max(
                (r for r in rows if r["scenario"] == scenario and r["connections"] == top and workers_of(r["server"])),
                key=lambda r: r["throughput"],
                default=None,
            )
            if best is None:
                continue
            gain = _ratio(best, index.get((scenario, top, "ours-w1")))
            versus = _ratio(best, index.get((scenario, top, "anchor")))
            name = f"{scenario} c={top}, {best['server']}"
            if gain is not None:
                out.append([f"{name} / 1 worker", f"≥ {WORKERS_LARGE_GAIN:g}x", f"{gain:.2f}x",
                            _met(gain >= WORKERS_LARGE_GAIN)])  # fmt: skip
            if versus is not None:
                out.append([f"{name} / anchor", f"≥ {WORKERS_LARGE_VS_ANCHOR:g}x", f"{versus:.2f}x",
                            _met(versus >= WORKERS_LARGE_VS_ANCHOR)])  # fmt: skip
    for what, mib in worker_memory(results).items():
        out.append([f"memory per extra worker ({what})", f"≤ {WORKER_MEMORY_BUDGET_MIB:g} MiB", f"{mib:.0f} MiB",
                    _met(mib <= WORKER_MEMORY_BUDGET_MIB)])  # fmt: skip
    return out


def _order(results: dict, scenario: str) -> int:
    names = list(THROUGHPUT_TARGETS)
    return names.index(scenario) if scenario in names else len(names)


def targets(results: dict) -> list[list[str]]:
    """docs/design.md §6 targets against this run."""
    rows = results.get("rows", [])
    index = _index(rows)
    top, low = 16, 1  # the targets' concurrencies; a run without one has no verdict on its targets
    out = []
    for scenario, target in THROUGHPUT_TARGETS.items():
        ratio = _ratio(index.get((scenario, top, "ours")), index.get((scenario, top, "anchor")))
        if ratio is not None:
            out.append([f"{scenario} ours/anchor c={top}", f"≥ {target:g}x", f"{ratio:.2f}x", _met(ratio >= target)])
    for scenario, budget in P50_BUDGETS_MS.items():
        ours, anchor = index.get((scenario, low, "ours")), index.get((scenario, low, "anchor"))
        if ours and anchor and "p50_ms" in ours and "p50_ms" in anchor:
            delta = ours["p50_ms"] - anchor["p50_ms"]
            out.append(
                [f"{scenario} p50 ours - anchor, c={low}", f"≤ +{budget} ms", f"{delta:+.2f} ms", _met(delta <= budget)]
            )
    cold = cold_starts(results)
    if "ours" in cold and "anchor" in cold:
        delta = cold["ours"]["median_s"] - cold["anchor"]["median_s"]
        out.append(
            [
                "cold start ours - anchor (median)",
                f"≤ +{COLD_BUDGET_S} s",
                f"{delta:+.2f} s",
                _met(delta <= COLD_BUDGET_S),
            ]
        )
    errors = sum(r.get("errors", 0) + r.get("warmup_errors", 0) for r in rows if r["server"] == "ours")
    wrong = sum(1 for c in results.get("checks", []) if c["server"] == "ours" and c["problem"])
    out.append(["ours: errors under load / wrong answers", "0", f"{errors} / {wrong}", _met(errors == 0 and not wrong)])
    return out


def _met(ok: bool) -> str:
    return "yes" if ok else "NO"


def cold_starts(results: dict) -> dict[str, dict[str, float]]:
    by_server: dict[str, list[float]] = {}
    for start in results.get("starts", []):
        if "trial" in start:
            by_server.setdefault(start["server"], []).append(start["ready_s"])
    return {
        server: {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "n": len(times)}
        for server, times in sorted(by_server.items(), key=lambda item: SERVER_ORDER.get(item[0], len(SERVER_ORDER)))
    }


def mme_loads(results: dict) -> dict[str, dict[str, float]]:
    """Median load and unload latency of each multi-model endpoint (bench/mme.py)."""
    out = {}
    for server in ("anchor", "ours"):
        rows = [r for r in results.get("mme_loads", []) if r["server"] == server]
        if rows:
            out[server] = {
                "load_s": statistics.median(r["load_s"] for r in rows),
                "unload_s": statistics.median(r["unload_s"] for r in rows),
                "n": len(rows),
            }
    return out


def _mme_line(server: str, m: dict[str, float]) -> str:
    return (
        f"MME {server} (text_encoder by url): load (POST /models → 200) median {m['load_s']:.2f} s, "
        f"unload {m['unload_s']:.2f} s (n={m['n']:.0f})"
    )


def show(results: dict) -> None:
    table = Table(
        title="SageMaker /invocations: anchor = Triton's C++ front end, ours = serve, proxy = FastAPI+tritonclient"
    )
    for h in HEADERS:
        table.add_column(h, justify="left" if h in ("scenario", "server") else "right")
    previous = None
    for row in table_rows(results):
        if previous is not None and (row[0], row[1]) != previous:
            table.add_section()
        previous = (row[0], row[1])
        table.add_row(*row, style="bold" if row[2] == "ours" else None)
    console.print(table)
    console.print(LEGEND)
    m = results.get("machine", {})
    console.print(
        f"machine: {m.get('cpu')}, {m.get('cores')} cores, Linux {m.get('kernel')}, Python {m.get('python')}, "
        f"commit {m.get('commit')}; load average start {results.get('loadavg_start')}, end {results.get('loadavg_end')}"
    )
    cal = results.get("calibration")
    if cal:
        console.print(
            f"client ceiling: {cal['what']}, c={cal['connections']}: {cal['throughput']:,.0f} req/s "
            f"at wrk CPU {cal['wrk_cpu']:.0%}"
        )
    cold = cold_starts(results)
    for server, c in cold.items():
        console.print(
            f"cold start {server}: median {c['median_s']:.2f} s (min {c['min_s']:.2f}, max {c['max_s']:.2f}, "
            f"n={c['n']})"
        )
    for server, m in mme_loads(results).items():
        console.print(_mme_line(server, m))
    t = Table(title="targets (docs/design.md §6)")
    for h in ("what", "target", "measured", "met"):
        t.add_column(h)
    for row in targets(results):
        t.add_row(*row, style=None if row[-1] == "yes" else "red")
    console.print(t)
    workers = worker_rows(results)
    if workers:
        w = Table(title="front workers: serve with N workers against one worker and the anchor")
        for h in WORKER_HEADERS:
            w.add_column(h, justify="left" if h == "scenario" else "right")
        for row in workers:
            w.add_row(*row)
        console.print(w)
        wt = Table(title=f"front workers' targets ({m.get('cpus_available')} CPUs, default {m.get('default_workers')})")
        for h in ("what", "target", "measured", "met"):
            wt.add_column(h)
        for row in worker_targets(results):
            wt.add_row(*row, style=None if row[-1] == "yes" else "red")
        console.print(wt)


def show_profile(entry: dict) -> None:
    console.print(
        f"[bold]py-spy, {entry.get('server', 'ours')}, {entry['scenario']} c={entry['connections']}[/]: "
        f"{entry['samples']} samples "
        f"({entry['under_profiler']['throughput']:,.0f} req/s under the profiler)"
    )
    for title, key in (
        ("self time by area", "self_by_area"),
        ("inclusive by area", "inclusive_by_area"),
        ("self time by function", "self_by_function"),
    ):
        console.print(f"  {title}: " + ", ".join(f"{name} {share:.0%}" for name, share in entry[key][:10]))


def compact(results: dict) -> list[str]:
    """One line per scenario and concurrency: the three servers side by side (the README's table)."""
    rows = results.get("rows", [])
    index = _index(rows)
    keys = sorted({(r["scenario"], r["connections"]) for r in rows}, key=lambda k: (_order(results, k[0]), k[1]))
    lines = [
        "| scenario | c | anchor req/s | ours req/s | proxy req/s | ours/anchor | ours/proxy "
        "| p50 ms anchor / ours / proxy | p99 ms anchor / ours / proxy | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for scenario, c in keys:
        got = {k: index.get((scenario, c, k)) for k in ("anchor", "ours", "proxy")}
        ok = {k: v for k, v in got.items() if v and "throughput" in v}

        def cell(kind: str, key: str, spec: str, ok: dict = ok) -> str:
            return format(ok[kind][key], spec) if kind in ok else "-"

        ratio_a, ratio_p = _ratio(got["ours"], got["anchor"]), _ratio(got["ours"], got["proxy"])
        errors = sum(v["errors"] + v.get("warmup_errors", 0) for v in ok.values())
        lines.append(
            f"| {scenario} | {c} | {cell('anchor', 'throughput', ',.0f')} | {cell('ours', 'throughput', ',.0f')} "
            f"| {cell('proxy', 'throughput', ',.0f')} | {_fmt(ratio_a, '.2f')} | {_fmt(ratio_p, '.1f')} "
            f"| {' / '.join(cell(k, 'p50_ms', '.2f') for k in ('anchor', 'ours', 'proxy'))} "
            f"| {' / '.join(cell(k, 'p99_ms', '.1f') for k in ('anchor', 'ours', 'proxy'))} | {errors} |"
        )
    return lines


def markdown(results: dict) -> str:
    lines = ["## Summary", "", *compact(results), "", "## Every row", ""]
    lines += ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    m, settings = results.get("machine", {}), results["settings"]
    lines += [
        "",
        f"Machine: {m.get('cpu')}, {m.get('cores')} cores; load average at start {results.get('loadavg_start')}; "
        f"commit {m.get('commit')}; {settings['warmup_s']:g} s warm-up + {settings['duration_s']:g} s "
        f"per row, wrk 1 thread.",
        "",
        LEGEND,
    ]
    cal = results.get("calibration")
    if cal:
        lines.append(
            f"Client ceiling: {cal['what']}, c={cal['connections']}: {cal['throughput']:,.0f} req/s "
            f"(wrk CPU {cal['wrk_cpu']:.0%})."
        )
    for server, c in cold_starts(results).items():
        lines.append(
            f"Cold start {server} (launch → /ping 200, text_encoder): median {c['median_s']:.2f} s "
            f"(n={c['n']}, {c['min_s']:.2f}-{c['max_s']:.2f})."
        )
    lines += [_mme_line(server, m) + "." for server, m in mme_loads(results).items()]
    lines += ["", "| target | wanted | measured | met |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in targets(results)]
    workers = worker_rows(results)
    if workers:
        lines += ["", "## Front workers", ""]
        lines += ["| " + " | ".join(WORKER_HEADERS) + " |", "|" + "---|" * len(WORKER_HEADERS)]
        lines += ["| " + " | ".join(row) + " |" for row in workers]
        lines += ["", "| target | wanted | measured | met |", "|---|---|---|---|"]
        lines += ["| " + " | ".join(row) + " |" for row in worker_targets(results)]
    return "\n".join(lines) + "\n"
