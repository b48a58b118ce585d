"""A real worker's data plane and the real endpoint's owner, over a real channel, with the real Triton:
every message between them crosses as the running `serve` sends it (no canned answers).

Both sides run in this test's event loop: the owner as `serve`'s main process assembles it (the
supervisor, the registry, the session keeper, the announcer, a worker pool whose one slot holds the
owner's end of the channel), the worker's plane as a worker builds it from its hello.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np
import pytest

from smtriton.serve.dataplane.plane import DataPlane
from smtriton.serve.dataplane.request import Request
from smtriton.serve.errors import ModelLoadFailed, ModelNotFound, NotReady, ServeError
from smtriton.serve.http.worker import _plane
from smtriton.serve.ipc.channel import Channel
from smtriton.serve.ipc.messages import Heartbeat, Message, ModelAdded
from smtriton.serve.metrics import Metrics
from smtriton.serve.multimodel.registry import ModelRegistry
from smtriton.serve.owner.endpoint import Endpoint
from smtriton.serve.owner.pool import WorkerPool
from smtriton.serve.settings import Settings
from smtriton.serve.triton.installation import find_triton
from smtriton.serve.triton.supervisor import TritonSupervisor
from tests.integration.conftest import TEST_MODELS
from tests.integration.contract_client import json_request
from tests.integration.harness import triton_pids

pytestmark = pytest.mark.integration

SEQUENCE_MODELS = Path(__file__).parent / "models_sequence"
ADDSUB = json.dumps(
    json_request({"INPUT0": np.ones((1, 16), dtype=np.int32), "INPUT1": np.ones((1, 16), dtype=np.int32)})
).encode()


def _request(model: str, body: bytes) -> Request:
    async def read_body() -> bytes:
        return body

    return Request(model, read_body, "application/json")


async def _until(predicate, timeout: float = 120) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.05)


def test_a_worker_plane_and_the_owner_speak_every_message_over_a_real_channel(tmp_path):
    root = tmp_path / "models"
    shutil.copytree(TEST_MODELS / "addsub", root / "m" / "model")
    shutil.copytree(SEQUENCE_MODELS / "accumulate", root / "seq" / "model")
    managed, work = tmp_path / "managed", tmp_path / "work"
    managed.mkdir()
    work.mkdir()
    settings = Settings(multi_model=True, model_root=root, memory_reserve_bytes=0, workers=1, work_dir=work)

    async def scenario() -> None:
        endpoint: list[Endpoint] = []

        async def on_live() -> None:
            await endpoint[0].on_triton_live()

        supervisor = TritonSupervisor(settings, find_triton(), managed, work, on_live=on_live)
        pool = WorkerPool(1)  # never started: its one slot holds the owner's end of the test's channel
        registry = ModelRegistry(settings, managed, supervisor.running_client)
        endpoint.append(Endpoint(settings, supervisor, Metrics(False), pool, None, registry))
        owner_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        planes: list[DataPlane] = []

        def worker_handler(message: Message) -> object:
            return planes[0].handle(message)

        owner = await Channel.open(owner_end, endpoint[0].handle)
        worker = await Channel.open(worker_end, worker_handler)
        readers = [asyncio.create_task(owner.run()), asyncio.create_task(worker.run())]
        supervisor.start()
        try:
            await _until(lambda: supervisor.live)
            planes.append(_plane(endpoint[0].hello(1), worker))  # as a worker builds it from its hello
            pool.slots[0].channel = owner  # from now on the worker hears every change
            endpoint[0].publish()
            plane = planes[0]
            await _until(lambda: plane.mirror.state.serving, 10)  # StateChanged crossed

            # the multi-model API: load, describe, list (the owner decides, the plane learns the model)
            await plane.load(json.dumps({"model_name": "m", "url": str(root / "m" / "model")}).encode(), None)
            assert "m" in plane.mirror.models  # ModelAdded crossed before the load was answered
            assert await plane.describe("m") == {"modelName": "m", "modelUrl": str(root / "m")}
            assert [m["modelName"] for m in (await plane.list_models(None, None))["models"]] == ["m"]
            with pytest.raises(ServeError) as missing:
                await plane.describe("absent")
            assert missing.value.status == ModelNotFound("absent").status

            # an invoke goes to Triton from the plane; a failure's verdict is the owner's
            answer = await plane.invoke(_request("m", ADDSUB))
            assert answer.status == 200
            assert plane.mirror.models["m"].inflight == 0
            assert await plane.owner.out_of_memory("CUDA out of memory. Tried to allocate 2 GiB", 500, None)
            assert not await plane.owner.out_of_memory("unexpected shape for input 'INPUT0'", 400, None)

            # a stateful session: opened, used (no longer starting once answered), closed
            await plane.load(json.dumps({"model_name": "seq", "url": str(root / "seq" / "model")}).encode(), None)
            value = b'{"inputs":[{"name":"VALUE","shape":[1,1],"datatype":"FP32","data":[2.0]}]}'
            steps = plane.sessions
            opened = await steps.step("seq", "NEW_SESSION", json.loads(value), True, False)
            assert opened.parameters is not None
            assert opened.parameters["sequence_start"] is True
            await steps.done(opened, True)  # SessionAnswered, as a call
            used = await steps.step("seq", opened.session, json.loads(value), True, False)
            assert used.parameters == {"sequence_id": opened.parameters["sequence_id"]}  # same sequence, started
            closing = await steps.step("seq", opened.session, {"requestType": "CLOSE"}, True, False)
            assert closing.parameters is None
            assert json.loads(closing.body) == {"closed_session_id": opened.session}
            with pytest.raises(ServeError, match="is not open here"):
                await steps.step("seq", opened.session, json.loads(value), True, False)

            # an unload: the model drains on the worker before Triton unloads it
            await plane.unload("m", None)
            assert "m" not in plane.mirror.models
            with pytest.raises(ModelNotFound):
                plane.mirror.begin_invoke("m", None)

            # a turn on probation (a request sent again after a Triton death): held while the block runs;
            # one whose wait is cancelled (its client left) leaves the line at once
            desk = endpoint[0].probation
            async with plane.owner.probation(time.monotonic() + 5):
                assert desk.holder is not None
                assert desk.holder[0] == os.getpid()
            await _until(lambda: desk.holder is None, 5)
            desk.grant((1, 1))  # another worker's request runs on probation

            async def sent_again() -> None:
                async with plane.owner.probation(time.monotonic() + 60):
                    pass

            waiting = asyncio.create_task(sent_again())
            await _until(lambda: desk.waiting == 1, 5)
            waiting.cancel()
            await _until(lambda: desk.waiting == 0, 5)
            desk.release((1, 1))
            assert desk.holder is None

            assert await owner.call(Heartbeat(), 5) is None  # the worker's loop answers its heartbeat

            await owner.close()  # the main process went away: the worker's questions are 503s, not bugs
            with pytest.raises(NotReady, match="main process is not reachable"):
                await plane.load(json.dumps({"model_name": "x", "url": str(root / "m" / "model")}).encode(), None)
            await plane.close()
        finally:
            await supervisor.stop(10)
            await worker.close()
            await owner.close()
            for reader in readers:
                reader.cancel()

    asyncio.run(scenario())


class _Owner:
    """The endpoint's owner as `serve` assembles it (MME), with ``count`` worker planes, each on a real
    channel of its own, started and stopped by :meth:`running`. ``hooks[i]``, where set, sees worker
    i's messages before its plane does (a worker that fails, or is slow, to record a model)."""

    def __init__(self, tmp_path: Path, count: int) -> None:
        self.root = tmp_path / "models"
        shutil.copytree(TEST_MODELS / "addsub", self.root / "m" / "model")
        self.managed, self.work = tmp_path / "managed", tmp_path / "work"
        self.managed.mkdir()
        self.work.mkdir()
        settings = Settings(multi_model=True, model_root=self.root, memory_reserve_bytes=0, workers=count)
        self.supervisor = TritonSupervisor(settings, find_triton(), self.managed, self.work, on_live=self._on_live)
        self.pool = WorkerPool(count)  # never started: its slots hold the owner's ends of the test's channels
        self.registry = ModelRegistry(settings, self.managed, self.supervisor.running_client)
        self.endpoint = Endpoint(settings, self.supervisor, Metrics(False), self.pool, None, self.registry)
        self.planes: list[DataPlane] = []
        self.hooks: dict[int, Callable[[Message], object]] = {}
        self._channels: list[Channel] = []
        self._readers: list[asyncio.Task[None]] = []

    async def _on_live(self) -> None:
        await self.endpoint.on_triton_live()

    def _worker_handler(self, index: int) -> Callable[[Message], object]:
        def handle(message: Message) -> object:
            hook = self.hooks.get(index)
            return hook(message) if hook is not None else self.planes[index].handle(message)

        return handle

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[_Owner]:
        self.supervisor.start()
        try:
            await _until(lambda: self.supervisor.live and self.endpoint.health.model_ready)
            for index, slot in enumerate(self.pool.slots):
                owner_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                owner = await Channel.open(owner_end, self.endpoint.handle)
                worker = await Channel.open(worker_end, self._worker_handler(index))
                self._channels += [owner, worker]
                self._readers += [asyncio.create_task(owner.run()), asyncio.create_task(worker.run())]
                self.planes.append(_plane(self.endpoint.hello(index + 1), worker))
                slot.channel = owner  # from now on the worker hears every change
            self.endpoint.publish()
            await _until(lambda: all(plane.mirror.state.serving for plane in self.planes), 10)
            yield self
        finally:
            for plane in self.planes:
                await plane.close()
            await self.supervisor.stop(10)
            for channel in self._channels:
                await channel.close()
            for reader in self._readers:
                reader.cancel()

    async def load(self, worker: int) -> None:
        body = json.dumps({"model_name": "m", "url": str(self.root / "m" / "model")}).encode()
        await self.planes[worker].load(body, None)

    def nobody_has_the_model(self) -> None:
        """Neither a worker, nor the announcer's table (what a new worker's hello carries), nor the registry."""
        assert ["m" in plane.mirror.models for plane in self.planes] == [False] * len(self.planes)
        assert self.endpoint.announcer.models == {}
        assert self.endpoint.hello(len(self.planes) + 1).models == ()
        assert self.registry.records == {}


def test_a_load_whose_announcement_fails_is_taken_back_from_the_workers_told_of_it(tmp_path):
    """Two workers: one answers the announcement with an error, the other records the model. The load
    fails, and the worker that recorded the model forgets it again."""

    async def scenario() -> None:
        owner = _Owner(tmp_path, 2)

        def cannot_record(message: Message) -> object:
            if isinstance(message, ModelAdded):
                raise RuntimeError("this worker cannot record the model")
            return owner.planes[1].handle(message)

        owner.hooks[1] = cannot_record
        async with owner.running():
            with pytest.raises(ServeError) as failed:
                await owner.load(0)
            assert failed.value.status == 500
            owner.nobody_has_the_model()
            with pytest.raises(ModelNotFound):
                owner.planes[0].mirror.begin_invoke("m", None)
            del owner.hooks[1]
            await owner.load(0)  # the name stays loadable
            assert ["m" in plane.mirror.models for plane in owner.planes] == [True, True]

    asyncio.run(scenario())


def test_a_load_that_a_triton_restore_drops_while_it_is_announced_is_taken_back_from_the_workers(tmp_path):
    """Two workers: the second is slow to record the model, so the announcement waits for it; meanwhile
    Triton dies and the restore cannot load the model again (its staged copy broke). The load fails, and
    the first worker, told of it already, forgets it."""

    async def scenario() -> None:
        owner = _Owner(tmp_path, 2)
        release = asyncio.Event()
        held: list[ModelAdded] = []

        def slow_to_record(message: Message) -> object:
            if not isinstance(message, ModelAdded):
                return owner.planes[1].handle(message)
            held.append(message)

            async def later() -> None:
                await release.wait()
                owner.planes[1].handle(message)

            return later()

        owner.hooks[1] = slow_to_record
        async with owner.running():
            load = asyncio.create_task(owner.load(0))
            await _until(lambda: bool(held), 60)  # loaded in Triton, being announced
            assert "m" in owner.planes[0].mirror.models
            (owner.managed / "m" / "config.pbtxt").write_text("not a model configuration {")
            (pid,) = triton_pids(str(owner.work))
            os.kill(pid, signal.SIGKILL)
            await _until(lambda: "m" not in owner.registry._announcing, 60)  # the restore dropped it
            release.set()
            with pytest.raises(ServeError, match="failed to load again when Triton restarted") as failed:
                await load
            assert failed.value.status == ModelLoadFailed("").status
            owner.nobody_has_the_model()

    asyncio.run(scenario())
