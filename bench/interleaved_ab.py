"""An interleaved A/B of serve's variants, for a machine others share (bench/NOTES.md Parts 12 and 14).

Every variant (a git revision's ``smtriton/``, or with ``.`` the working tree's where no history is at
hand, as on a lent GPU host; optionally with environment variables) runs ``serve`` with
one worker (unless its variables say otherwise) at once, each on its own Triton, in front of the
scenario's model (the tiny scenario's ``addsub``, the text encoder, with ``--own-model`` resnet; with
``--instances N`` a copy of it with N instances) or, for the image body, ``sink``, a model that
costs Triton next to nothing (FP32 [1,3,224,224] in, its mean out, built here with onnx). Rounds of short
wrk runs go to each variant in turn, the order reversed every round, so that drift in the machine's load
falls on all of them alike; the first round warms up. Per variant, the median over rounds of: req/s, p50,
the front's CPU per request (its processes, Triton's excluded), of it user time, its minor page faults
per request, Triton's CPU per request, Triton's mean executed batch (rows an execution ran) and the
requests Triton answered per client request (below 1 where the front merged); and the front's
proportional set size after the last round. A variant named ``anchor``
is NVIDIA's SageMaker front end on the same Triton (its front is inside Triton, so it has no front CPU);
beside it every other variant also gets the median over rounds of its req/s over the anchor's and its
p50 minus the anchor's, each taken within a round: a ratio to the anchor on a machine whose load drifts.
A variant named ``floor`` is :mod:`bench.floor_front`, the least a Python front must do per request (parse
HTTP, write to Triton, parse its answer, write it back), on a Triton of its own: what serve adds above it
is what its checks, merging and contract cost; ``floor-task`` is the floor with each request in an asyncio
task of its own, as serve has it (what a task per request costs).
With ``--think-ms N`` each connection waits N ms between an answer and its next request, as a client
that does anything between its requests does: Triton then wakes from idle for every request (a closed
loop at c=1 keeps the anchor's Triton busy and never lets it sleep, bench/NOTES.md Part 18).

    python -m bench.interleaved_ab --rounds 8 --seconds 2 --scenario image_binary --connections 1 \\
        house=house client=HEAD client-malloc=HEAD@MALLOC_MMAP_THRESHOLD_=4194304,MALLOC_TRIM_THRESHOLD_=16777216
    python -m bench.interleaved_ab --rounds 8 --seconds 3 --scenario tiny_binary --connections 16 anchor ours=HEAD
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.scenarios import build_scenarios, not_built, with_instances
from bench.servers import (
    TritonSetup,
    export_revision,
    first_on_path,
    process_tree,
    triton_http_port,
    triton_stats,
)
from smtriton.local.serve_process import free_port

LUA = Path(__file__).resolve().parent / "post.lua"


def _sink_model(root: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, [1, 3, 224, 224])
    y = helper.make_tensor_value_info("mean", TensorProto.FLOAT, [1, 1, 1, 1])
    node = helper.make_node("ReduceMean", ["pixel_values"], ["mean"], axes=[1, 2, 3], keepdims=1)
    model = helper.make_model(helper.make_graph([node], "sink", [x], [y]), opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (root / "sink" / "1").mkdir(parents=True)
    onnx.save(model, str(root / "sink" / "1" / "model.onnx"))
    (root / "sink" / "config.pbtxt").write_text(
        'name: "sink"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        'input [ { name: "pixel_values" data_type: TYPE_FP32 dims: [1, 3, 224, 224] } ]\n'
        'output [ { name: "mean" data_type: TYPE_FP32 dims: [1, 1, 1, 1] } ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )
    return root


def _onnx_addsub_model(root: Path) -> Path:
    """``addsub`` as ONNX (OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, INT32 [batch, 16]): the
    tiny scenarios' model at next to no cost in Triton (ONNX Runtime, no Python stub), for the floor of
    what a front adds to a request."""
    import onnx
    from onnx import TensorProto, helper

    tensors = {n: helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 16]) for n in ("INPUT0", "INPUT1")}
    outputs = [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 16]) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
    ]
    graph = helper.make_graph(nodes, "addsub", list(tensors.values()), outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (root / "addsub" / "1").mkdir(parents=True)
    onnx.save(model, str(root / "addsub" / "1" / "model.onnx"))
    specs = {
        kind: ", ".join(f'{{ name: "{name}" data_type: TYPE_INT32 dims: [16] }}' for name in names)
        for kind, names in (("input", tensors), ("output", ("OUTPUT0", "OUTPUT1")))
    }
    (root / "addsub" / "config.pbtxt").write_text(
        'name: "addsub"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        f"input [ {specs['input']} ]\noutput [ {specs['output']} ]\n"
        "instance_group [ { count: 1 kind: KIND_CPU } ]\ndynamic_batching { }\n"
    )
    return root


def _tree_pids(root: int) -> dict[str, list[int]]:
    """``root``'s process tree, split into Triton's processes and the front's."""
    roles: dict[str, list[int]] = {"front": [], "triton": []}
    for pid in process_tree(root):
        try:
            name = Path(f"/proc/{pid}/comm").read_text()
        except OSError:
            continue
        roles["triton" if "triton" in name else "front"].append(pid)
    return roles


def _usage(pids: list[int]) -> tuple[float, float, int]:
    """CPU seconds, user seconds and minor faults of ``pids`` so far."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu = user = 0.0
    faults = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2 :].split()
        user += int(rest[11]) / tick
        cpu += (int(rest[11]) + int(rest[12])) / tick
        faults += int(rest[7])
    return cpu, user, faults


Servers = dict[str, tuple[subprocess.Popen[bytes], int]]  # variant -> its serve and port


ANCHOR = "anchor"
FLOOR = "floor"
FLOOR_TASK = "floor-task"  # the floor, each request in a task of its own
WORKING_TREE = "."  # a variant's revision: the working tree as it is (where no git history is at hand)
_REPO = Path(__file__).resolve().parent.parent


def _start(variants: list[str], repository: Path, model: str, work: Path, servers: Servers) -> None:
    """Every variant's server, started at once, each put in ``servers`` as it starts (so that the caller
    stops those started when another does not start)."""
    for variant in variants:
        if variant == ANCHOR:
            servers[ANCHOR] = _start_anchor(repository, model, work)
            continue
        if variant in (FLOOR, FLOOR_TASK):
            servers[variant] = _start_floor(repository, model, work, variant)
            continue
        name, _, spec = variant.partition("=")
        revision, _, extra = spec.partition("@")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))}
        source = _REPO if revision == WORKING_TREE else export_revision(revision, work)
        env.update(PYTHONPATH=first_on_path(source, env), PYTHONSAFEPATH="1")
        env.update(SAGEMAKER_MODEL_SERVER_WORKERS="1", SMTRITON_WORK_DIR=str(work / f"work-{name}"))
        env.update(dict(kv.split("=", 1) for kv in extra.split(",") if kv))
        port = free_port()
        cmd = [sys.executable, "-m", "smtriton.serve", "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["--model-repository", str(repository), "--default-model", model]
        with (work / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        servers[name] = proc, port
    for name, (proc, port) in servers.items():
        deadline = time.monotonic() + 180
        while not _pings(port):
            if time.monotonic() > deadline or proc.poll() is not None:
                tail = (work / f"{name}.log").read_text(errors="replace").splitlines()[-20:]
                raise SystemExit("\n".join([f"{name} did not start; the end of its log:", *tail]))
            time.sleep(0.2)


def _start_anchor(repository: Path, model: str, work: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Triton with its SageMaker front end, as the benchmark runs the anchor (its HTTP endpoint kept on
    loopback for the statistics)."""
    port = free_port()
    cmd, env = TritonSetup.create(work).anchor(repository, model, port, free_port())
    with (work / f"{ANCHOR}.log").open("wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, port


def _start_floor(repository: Path, model: str, work: Path, variant: str) -> tuple[subprocess.Popen[bytes], int]:
    """The floor front (:mod:`bench.floor_front`) on a Triton of its own (``floor-task``: with ``--task``)."""
    port = free_port()
    cmd = [sys.executable, "-m", "bench.floor_front", "--port", str(port), "--model-repository", str(repository)]
    cmd += ["--model", model, "--work", str(work / variant)] + (["--task"] if variant == FLOOR_TASK else [])
    with (work / f"{variant}.log").open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=_REPO)
    return proc, port


def _front_pss_mib(root: int) -> float:
    """The proportional set size of ``root``'s front processes now, MiB (Triton's excluded)."""
    total = 0
    for pid in _tree_pids(root)["front"]:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")), 0)
    return total / 1024


def _pings(port: int) -> bool:
    try:
        return bool(urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2).status == 200)
    except OSError:
        return False


def _measure(pid: int, port: int, model: str, args: argparse.Namespace, wrk_env: dict[str, str]) -> tuple[float, ...]:
    """One wrk run: req/s, p50 ms, front CPU ms/req, its user ms/req, minor faults/req, Triton CPU ms/req,
    Triton's mean batch and its requests per client request (NaN where its statistics did not answer)."""
    roles = _tree_pids(pid)
    stats_port = triton_http_port(roles["triton"])
    stats0 = triton_stats(stats_port, model) if stats_port else None
    front0, triton0 = _usage(roles["front"]), _usage(roles["triton"])
    cmd = ["wrk", "-t1", f"-c{args.connections}", f"-d{args.seconds:g}s", "--timeout=10s", "-s", str(LUA)]
    cmd.append(f"http://127.0.0.1:{port}/invocations")
    out = subprocess.run(cmd, env=wrk_env, capture_output=True, text=True, timeout=args.seconds + 60).stdout
    front1, triton1 = _usage(roles["front"]), _usage(roles["triton"])
    stats1 = triton_stats(stats_port, model) if stats_port else None
    raw = json.loads(next(ln for ln in out.splitlines() if ln.startswith("BENCH_RESULT "))[13:])
    errors = sum(raw[k] for k in ("connect", "read", "write", "status", "timeout"))
    if errors:
        raise SystemExit(f"port {port}: {errors} errors")
    n = raw["requests"]
    batch = per_request = math.nan
    if stats0 is not None and stats1 is not None:
        executions = stats1["executions"] - stats0["executions"]
        batch = (stats1["inferences"] - stats0["inferences"]) / executions if executions else math.nan
        per_request = (stats1["requests"] - stats0["requests"]) / n
    return (
        n / (raw["duration_us"] / 1e6),
        raw["p50_us"] / 1000,
        (front1[0] - front0[0]) * 1000 / n,
        (front1[1] - front0[1]) * 1000 / n,
        (front1[2] - front0[2]) / n,
        (triton1[0] - triton0[0]) * 1000 / n,
        batch,
        per_request,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--scenario", choices=[s.name for s in build_scenarios()], default="image_binary")
    p.add_argument("--connections", type=int, default=1)
    p.add_argument(
        "--own-model", action="store_true", help="the image body goes to its own model (resnet), not to sink"
    )
    p.add_argument(
        "--onnx-tiny",
        action="store_true",
        help="the tiny bodies go to addsub in ONNX (next to no cost in Triton), not the Python-backend addsub",
    )
    p.add_argument(
        "--instances",
        type=int,
        default=0,
        help="serve a copy of the model with this many instances (0: as the repository has it)",
    )
    p.add_argument(
        "--think-ms",
        type=int,
        default=0,
        help="each connection waits this long between an answer and its next request (0: none, a closed loop)",
    )
    p.add_argument(
        "variants",
        nargs="+",
        help="NAME=REV or NAME=REV@VAR=VALUE,VAR=VALUE (REV . is the working tree), anchor, floor or floor-task",
    )
    args = p.parse_args()
    scenario = next(s for s in build_scenarios() if s.name == args.scenario)
    sink = scenario.model == "resnet_onnx" and not args.own_model
    missing = None if sink else not_built(scenario.repository, scenario.model)
    if missing:
        sys.exit(f"error: {missing}")
    work = Path(tempfile.mkdtemp(prefix="smtriton-ab-"))
    body = work / "body"
    body.write_bytes(scenario.body)
    if sink:
        repository, model = _sink_model(work / "models"), "sink"
    elif args.onnx_tiny and scenario.model == "addsub":
        repository, model = _onnx_addsub_model(work / "models"), "addsub"
    else:
        repository, model = scenario.repository, scenario.model
        if args.instances:
            repository = with_instances(repository, model, args.instances, work)
    servers: Servers = {}
    try:
        _start(args.variants, repository, model, work, servers)
        names = list(servers)
        wrk_env = {**os.environ, "BENCH_METHOD": "POST", "BENCH_BODY": str(body)}
        wrk_env["BENCH_CONTENT_TYPE"] = scenario.content_type
        wrk_env["BENCH_THINK_MS"] = str(args.think_ms)
        results: dict[str, list[tuple[float, ...]]] = {name: [] for name in names}
        for round_ in range(args.rounds + 1):
            for name in names if round_ % 2 == 0 else names[::-1]:
                measured = _measure(servers[name][0].pid, servers[name][1], model, args, wrk_env)
                if round_ > 0:  # the first round warms up
                    results[name].append(measured)
        instances = f", {args.instances} instances" if args.instances else ""
        instances += ", addsub in ONNX" if args.onnx_tiny and model == "addsub" and not sink else ""
        think = f", {args.think_ms} ms between an answer and the next request" if args.think_ms else ""
        rounds = f"{args.rounds} rounds of {args.seconds:g} s"
        print(f"{args.scenario} c={args.connections}{instances}{think}, {rounds}, medians:")
        anchor = results.get(ANCHOR)
        for name in names:
            rate, p50, front, user, faults, triton, batch, per_request = (
                statistics.median(r[i] for r in results[name]) for i in range(8)
            )
            own_front = (
                "front CPU     -"
                if name == ANCHOR
                else f"front CPU {front:.3f} ms/req (user {user:.3f}), {_front_pss_mib(servers[name][0].pid):.0f} MiB"
            )
            against = ""
            if anchor is not None and name != ANCHOR:
                ratio = statistics.median(r[0] / a[0] for r, a in zip(results[name], anchor, strict=True))
                later = statistics.median(r[1] - a[1] for r, a in zip(results[name], anchor, strict=True))
                against = f"  {ratio:.2f}x anchor, p50 {later:+.3f} ms"
            print(
                f"  {name:16s} {rate:7.0f} req/s  p50 {p50:7.3f} ms  {own_front}"
                f"  minor faults {faults:6.1f}/req  Triton CPU {triton:.3f} ms/req"
                f"  Triton batch {batch:.2f} / {per_request:.2f} req per req{against}"
            )
    finally:
        for proc, _ in servers.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in servers.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
