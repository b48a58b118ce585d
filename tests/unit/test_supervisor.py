"""The real Triton supervisor, driving a stand-in tritonserver: a small program that answers Triton's
health endpoint on the port it is given, so start-up, hooks, restarts and stop run for real."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from smtriton.serve.errors import TritonUnavailable
from smtriton.serve.settings import Settings
from smtriton.serve.supervisor import TritonState, TritonSupervisor
from smtriton.serve.triton.installation import TritonInstallation

STAND_IN = textwrap.dedent(
    """\
    #!{python}
    import http.server, signal, sys
    port = int(next(a for a in sys.argv if a.startswith("--http-port=")).split("=")[1])
    class Live(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/v2/health/live" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()
        def log_message(self, *args):
            pass
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    http.server.HTTPServer(("127.0.0.1", port), Live).serve_forever()
    """
)


@pytest.fixture
def installation(tmp_path: Path) -> TritonInstallation:
    binary = tmp_path / "bin" / "tritonserver"
    binary.parent.mkdir()
    binary.write_text(STAND_IN.format(python=sys.executable))
    binary.chmod(0o755)
    backends = tmp_path / "backends" / "python"
    backends.mkdir(parents=True)
    (backends / "libtriton_python.so").write_bytes(b"")
    return TritonInstallation(binary=binary, backends=backends.parent)


def _supervisor(tmp_path: Path, installation: TritonInstallation, **hooks) -> TritonSupervisor:
    repository = tmp_path / "repo"
    repository.mkdir(exist_ok=True)
    settings = Settings(startup_timeout_s=20, triton_exit_timeout_s=1)
    return TritonSupervisor(settings, installation, repository, tmp_path, **hooks)


async def _until(predicate, timeout: float) -> None:
    """Poll ``predicate`` (the supervisor offers no event for every state a test looks for)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "not reached in time"
        await asyncio.sleep(0.02)


def test_a_hook_that_fails_is_a_failed_start_retried_with_back_off(tmp_path, installation):
    """A failing on_live hook (Triton dying again while models are restored, say) stops the Triton it
    started and starts another after the back-off; supervision never ends on it."""

    async def scenario() -> None:
        calls: list[int] = []

        async def on_live() -> None:
            calls.append(supervisor.process.pid)  # type: ignore[union-attr]
            if len(calls) == 1:
                raise TritonUnavailable("Triton is not reachable: ServerDisconnectedError")

        changes: list[TritonState] = []
        supervisor = _supervisor(
            tmp_path, installation, on_live=on_live, on_change=lambda: changes.append(supervisor.state)
        )
        supervisor.start()
        try:
            await _until(lambda: supervisor.live, 30)
            assert len(calls) == 2
            first, second = calls
            assert first != second
            assert _gone(first)  # the first Triton was stopped
            assert TritonState.DOWN in changes  # /ping failed meanwhile
            assert supervisor.running
        finally:
            await supervisor.stop()
        assert not supervisor.running

    asyncio.run(scenario())


def test_a_triton_that_dies_while_its_hook_runs_is_started_again(tmp_path, installation):
    """The hook's calls to a Triton killed meanwhile may never answer (its backend stubs keep the
    connection open): Triton's exit ends the hook and fails the start, at once."""

    async def scenario() -> None:
        hooked = asyncio.Event()
        calls = 0

        async def on_live() -> None:
            nonlocal calls
            calls += 1
            if calls == 1:
                hooked.set()
                await asyncio.Event().wait()  # a call that never answers

        supervisor = _supervisor(tmp_path, installation, on_live=on_live)
        supervisor.start()
        try:
            await asyncio.wait_for(hooked.wait(), 30)
            os.kill(supervisor.process.pid, signal.SIGKILL)  # type: ignore[union-attr]
            await _until(lambda: supervisor.live, 30)
            assert calls == 2
        finally:
            await supervisor.stop()

    asyncio.run(scenario())


def test_a_listener_that_raises_does_not_stop_the_supervision(tmp_path, installation):
    async def scenario() -> None:
        def broken() -> None:
            raise RuntimeError("a listener's bug")

        supervisor = _supervisor(tmp_path, installation, on_change=broken, on_exit=broken)
        supervisor.start()
        try:
            await _until(lambda: supervisor.live, 30)
            pid = supervisor.process.pid  # type: ignore[union-attr]
            os.kill(pid, signal.SIGKILL)  # dies on its own: on_exit (broken) runs, then a restart
            await _until(lambda: supervisor.live and supervisor.process.pid != pid, 30)  # type: ignore[union-attr]
        finally:
            await supervisor.stop()

    asyncio.run(scenario())


def test_ports_and_client_follow_each_restart(tmp_path, installation):
    async def scenario() -> None:
        supervisor = _supervisor(tmp_path, installation)
        supervisor.start()
        try:
            await _until(lambda: supervisor.live, 30)
            first = supervisor.ports
            assert first is not None
            assert await supervisor.running_client().server_live()
            os.kill(supervisor.process.pid, signal.SIGKILL)  # type: ignore[union-attr]
            await _until(lambda: not supervisor.live, 5)
            await _until(lambda: supervisor.live, 30)
            assert supervisor.ports is not None
            assert supervisor.ports.http != first.http  # a fresh free port each start
            assert await supervisor.running_client().server_live()
        finally:
            await supervisor.stop()
        assert supervisor.state is TritonState.STOPPING

    asyncio.run(scenario())


def _gone(pid: int) -> bool:
    """No such process, or only its exit status left (a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True
