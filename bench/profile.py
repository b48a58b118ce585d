"""py-spy on the front server under load: where its per-request CPU goes.

``py-spy record --format raw`` writes collapsed stacks (``frame;frame;... count``), one per line, only
for threads that are running (idle threads are left out), so samples / rate ~ CPU seconds of Python.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*)\)$")


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise RuntimeError("py-spy not found: pip install py-spy (the bench extra has it)")
    return found


def start_recording(pid: int, seconds: float, output: Path, rate: int = 250) -> subprocess.Popen[bytes]:
    """py-spy on ``pid`` and its child processes: serve answers requests in its front workers, not in the
    main process it starts them from."""
    cmd = [py_spy(), "record", "--pid", str(pid), "--subprocesses", "--duration", str(max(1, round(seconds)))]
    cmd += ["--rate", str(rate)]
    cmd += ["--format", "raw", "--nolineno", "--full-filenames", "--nonblocking", "--output", str(output)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def area(path: str) -> str:
    """A frame's file as a short area name: ``serve/http/app.py``, ``aiohttp``, ``asyncio``, ``uvicorn``..."""
    if "/site-packages/" in path:
        return path.split("/site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    for marker in ("/serve/", "/bench/"):
        if marker in path:
            return marker.strip("/") + "/" + path.split(marker, 1)[1]
    parts = Path(path).parts
    if "lib" in parts:  # the standard library: its package or module name
        rest = parts[parts.index("lib") + 2 :] if len(parts) > parts.index("lib") + 2 else parts[-1:]
        return rest[0].removesuffix(".py")
    return Path(path).name


@dataclass
class Summary:
    samples: int
    seconds: float
    self_by_function: list[tuple[str, float]]  # (function @ area, share of samples)
    self_by_area: list[tuple[str, float]]
    inclusive_by_area: list[tuple[str, float]]
    inclusive_by_function: list[tuple[str, float]]

    def to_dict(self) -> dict[str, object]:
        return {
            "samples": self.samples,
            "seconds": self.seconds,
            "self_by_function": self.self_by_function,
            "self_by_area": self.self_by_area,
            "inclusive_by_area": self.inclusive_by_area,
            "inclusive_by_function": self.inclusive_by_function,
        }


def summarize(raw: Path, seconds: float, top: int = 15) -> Summary:
    self_fn: Counter[str] = Counter()
    self_area: Counter[str] = Counter()
    incl_area: Counter[str] = Counter()
    incl_fn: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = []
        for frame in stack.split(";"):
            match = _FRAME.match(frame)
            if match is None:  # e.g. the thread name
                continue
            frames.append((match["func"], area(match["file"])))
        if not frames:
            continue
        func, leaf_area = frames[-1]
        self_fn[f"{func} @ {leaf_area}"] += count
        self_area[leaf_area] += count
        for name in {a for _, a in frames}:
            incl_area[name] += count
        for name in {f"{f} @ {a}" for f, a in frames}:
            incl_fn[name] += count

    def shares(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(k, v / total) for k, v in counter.most_common(top)] if total else []

    return Summary(total, seconds, shares(self_fn), shares(self_area), shares(incl_area), shares(incl_fn))
