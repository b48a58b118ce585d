"""The main process's reaper: an orphan it adopts is reaped; a child it started is left to whoever
waits for it, exit status intact. Run in a child Python, since a subreaper stays one for life."""

from __future__ import annotations

import json
import subprocess
import sys

# A subreaper with three children, as serve has them: one in its session (a fork server, a command),
# one leading a session of its own (Triton), and one leading a session that leaves a process of that
# session behind when it exits (Triton's stubs when it dies). The first two exit at once and wait, as
# zombies, for their owners; the third's leftover exits later, adopted.
SUBREAPER = """
import json, os, time
from smtriton.serve.owner import reaper

assert reaper.become_subreaper()
own = os.fork()
if own == 0:
    os._exit(7)
leader = os.fork()
if leader == 0:
    os.setsid()
    os._exit(9)
read, write = os.pipe()
parent = os.fork()
if parent == 0:
    os.setsid()
    orphan = os.fork()
    if orphan == 0:
        time.sleep(0.5)  # outlives its parent
        os._exit(3)
    os.write(write, str(orphan).encode())
    os._exit(0)
os.waitpid(parent, 0)  # its owner waits for it
orphan = int(os.read(read, 32))
reaped, deadline = [], time.monotonic() + 10
while not reaped and time.monotonic() < deadline:
    reaped = reaper.reap_orphans()
    time.sleep(0.05)
owners = {name: os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for name, pid in (("own", own), ("leader", leader))}
print(json.dumps({"reaped": reaped, "orphan": orphan, "owners": owners, "left": reaper.reap_orphans()}))
"""


def test_an_adopted_orphan_is_reaped_and_every_child_started_keeps_its_exit_status_for_its_owner():
    done = subprocess.run([sys.executable, "-c", SUBREAPER], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["reaped"] == [result["orphan"]]
    assert result["owners"] == {"own": 7, "leader": 9}  # zombies meanwhile, and never reaped by it
    assert result["left"] == []


# A subreaper whose orphan is still alive, and dies a moment later, when the subreaper's exit begins.
LAST = """
import asyncio, json, os, time
from smtriton.serve.owner import reaper

assert reaper.become_subreaper()
read, write = os.pipe()
parent = os.fork()
if parent == 0:
    os.setsid()
    orphan = os.fork()
    if orphan == 0:
        time.sleep(0.3)
        os._exit(0)
    os.write(write, str(orphan).encode())
    os._exit(0)
os.waitpid(parent, 0)
orphan = int(os.read(read, 32))
started = time.monotonic()
asyncio.run(reaper.reap_the_last(5))
print(json.dumps({"gone": not os.path.exists(f"/proc/{orphan}"), "waited": time.monotonic() - started}))
"""


def test_on_the_way_out_the_orphans_still_dying_are_waited_for_and_reaped():
    done = subprocess.run([sys.executable, "-c", LAST], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["gone"]  # reaped here, not left a zombie for another init
    assert result["waited"] < 5  # as long as the orphan took, not the whole timeout
