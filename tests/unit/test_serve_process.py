"""The serve launcher's failure paths: a child that exits at start, and one that ignores SIGTERM."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from smtriton.local.serve_process import ServeProcess

# Ignores SIGTERM and leaves a grandchild in its process group: only the group kill ends them both.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("grandchild", grandchild.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_serve_that_exits_at_start_is_reported_with_its_log(tmp_path):
    server = ServeProcess(["--no-such-flag"], tmp_path / "serve.log", env=dict(os.environ))
    try:
        with pytest.raises(RuntimeError, match=r"serve exited with 2:\n(.|\n)*--no-such-flag"):
            server.wait_healthy(60)
    finally:
        assert server.stop(10) == 2
    assert server.returncode == 2


def test_stop_kills_the_whole_group_of_a_child_that_ignores_sigterm(tmp_path):
    (tmp_path / "stubborn.py").write_text(STUBBORN)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    server = ServeProcess([], tmp_path / "stubborn.log", env=env, module="stubborn")
    try:
        deadline = time.monotonic() + 30
        while "grandchild" not in server.log_text():
            assert server.poll() is None, server.log_tail()
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.05)
        grandchild = int(server.log_text().split()[1])
        assert server.command[:3] == [sys.executable, "-m", "stubborn"]
    finally:
        code = server.stop(timeout=0.5)
    assert code == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)
