"""A local SageMaker endpoint: the SageMaker Runtime `InvokeEndpoint` API in front of a real `serve`.

`boto3.client("sagemaker-runtime", endpoint_url=...)` works against it unchanged. For a multi-model
endpoint it does what SageMaker does: finds the `TargetModel` archive under a local folder or an S3
prefix, extracts it safely to `<model root>/<model hash>/model`, loads it with `POST /models`, keeps the
loaded models under a capacity limit, and on capacity or a 507 unloads the least recently used one and
retries. Without `TargetModel` it serves a single-model endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
from fastapi import FastAPI, Request, Response

from smtriton.local.archive import ArchiveError, ExtractLimits, safe_extract
from smtriton.local.serve_process import ServeProcess
from smtriton.serve.headers import CLOSED_SESSION as CLOSED_SESSION_HEADER
from smtriton.serve.headers import NEW_SESSION as NEW_SESSION_HEADER
from smtriton.serve.headers import SESSION as SESSION_HEADER

log = logging.getLogger("smtriton.local_endpoint")

TARGET = "X-Amzn-SageMaker-Target-Model"
PASSED_HEADERS = ("Accept", "X-Amzn-SageMaker-Custom-Attributes", "X-Amzn-SageMaker-Inference-Id", SESSION_HEADER)


def model_hash(target_model: str) -> str:
    """SageMaker names an MME model directory by an opaque hash of its TargetModel."""
    return hashlib.sha256(target_model.encode()).hexdigest()[:32]


@dataclass
class ArchiveSource:
    """Where TargetModel archives come from: a local folder or an ``s3://bucket/prefix`` (read with the
    ``s3`` client the command made, so that its --region and --profile hold)."""

    location: str
    s3: object = field(default=None, repr=False)

    def fetch(self, target_model: str, into: Path) -> Path:
        if ".." in Path(target_model).parts or target_model.startswith("/"):
            raise ArchiveError(f"TargetModel '{target_model}' must be a relative path without '..'")
        if self.location.startswith("s3://"):
            bucket, _, prefix = self.location[5:].partition("/")
            key = f"{prefix.rstrip('/')}/{target_model}" if prefix else target_model
            if self.s3 is None:
                from smtriton.aws.session import s3_client

                self.s3 = s3_client()
            path = into / "archive.tar.gz"
            try:
                self.s3.download_file(bucket, key, str(path))  # type: ignore[attr-defined]
            except Exception as exc:
                raise ArchiveError(f"could not download s3://{bucket}/{key}: {exc}") from None
            return path
        path = Path(self.location) / target_model
        if not path.is_file():
            raise ArchiveError(f"no archive {target_model} under {self.location}")
        return path


@dataclass
class LoadedModels:
    """Loaded model hashes, least recently used first."""

    capacity: int
    order: OrderedDict[str, str] = field(default_factory=OrderedDict)  # hash -> TargetModel
    loads: int = 0
    evictions: int = 0


def _model_error(status: int, message: bytes, endpoint: str) -> Response:
    """What SageMaker answers when the container fails: 424 ModelError carrying the original answer."""
    text = message.decode("utf-8", errors="replace")
    kind = "client" if status < 500 else "server"
    body = {
        "ErrorCode": f"{kind.upper()}_ERROR_FROM_MODEL",
        "OriginalStatusCode": status,
        "OriginalMessage": text,
        "LogStreamArn": f"arn:aws:logs:local:000000000000:log-group:/aws/sagemaker/Endpoints/{endpoint}",
        "message": f'Received {kind} error ({status}) from primary with message "{text}".',
    }
    return Response(orjson.dumps(body), status_code=424, headers={"x-amzn-ErrorType": "ModelError:"})


def _answer_headers(container: Mapping[str, str]) -> dict[str, str]:
    """The headers SageMaker gives the caller of a successful invoke, from the container's answer."""
    out = {"Content-Type": container.get("Content-Type", "application/json")}
    out["x-Amzn-Invoked-Production-Variant"] = "AllTraffic"
    if (attributes := container.get("X-Amzn-SageMaker-Custom-Attributes")) is not None:
        out["X-Amzn-SageMaker-Custom-Attributes"] = attributes
    # The session a container opened (its session header, with the expiry) reaches the caller as NewSessionId.
    if (opened := container.get(NEW_SESSION_HEADER) or container.get(SESSION_HEADER)) is not None:
        out[NEW_SESSION_HEADER] = opened
    if (closed := container.get(CLOSED_SESSION_HEADER)) is not None:
        out[CLOSED_SESSION_HEADER] = closed
    return out


def _service_error(status: int, code: str, message: str) -> Response:
    return Response(orjson.dumps({"message": message}), status_code=status, headers={"x-amzn-ErrorType": f"{code}:"})


@dataclass
class _Serve:
    """The running `serve` behind the emulator and the one HTTP session every route talks to it with."""

    child: ServeProcess
    session: aiohttp.ClientSession


class _Placement:
    """Multi-model placement as SageMaker does it: a TargetModel's archive is fetched and extracted once,
    loaded with ``POST /models``, and the least recently used model is unloaded past capacity or on 507."""

    def __init__(
        self,
        endpoint_name: str,
        work_dir: Path,
        source: ArchiveSource,
        loaded: LoadedModels,
        model_url_root: str | None = None,
        limits: ExtractLimits | None = None,
    ) -> None:
        self.endpoint_name = endpoint_name
        self.limits = limits or ExtractLimits()
        self.work_dir = work_dir
        self.model_root = work_dir / "models"
        self.model_url_root = model_url_root or str(self.model_root)
        self.source = source
        self.loaded = loaded
        self.lock = asyncio.Lock()  # SageMaker serialises model placement on an instance; so do we

    async def _unload_lru(self, serve: _Serve) -> bool:
        if not self.loaded.order:
            return False
        victim, target = self.loaded.order.popitem(last=False)
        async with serve.session.delete(f"{serve.child.url}/models/{victim}") as resp:
            await resp.read()
        await _remove(self.model_root / victim)
        self.loaded.evictions += 1
        log.info("unloaded %s (least recently used) to make room", target)
        return True

    async def _extract(self, target: str, model_dir: Path) -> Response | None:
        """Fetch and extract the archive into ``model_dir`` (afresh: a corrected archive is read again);
        the ValidationError answer, logged as one line, if it cannot be."""
        await _remove(model_dir.parent)
        try:
            scratch = Path(await asyncio.to_thread(tempfile.mkdtemp, dir=self.work_dir))
            try:
                try:
                    archive = await asyncio.to_thread(self.source.fetch, target, scratch)
                except (ArchiveError, OSError) as exc:
                    raise ArchiveError(f"Failed to download model data: {exc}") from None
                await asyncio.to_thread(safe_extract, archive, model_dir, name=target, limits=self.limits)
            finally:
                await _remove(scratch)
        except (ArchiveError, OSError) as exc:
            await _remove(model_dir.parent)
            log.warning("TargetModel %s refused: %s", target, exc)
            return _service_error(400, "ValidationError", str(exc))
        return None

    async def _load(self, serve: _Serve, name: str, target: str, model_dir: Path) -> Response | None:
        """Load into serve, making room on memory pressure; the error answer if it fails."""
        while True:
            url = f"{self.model_url_root}/{model_dir.relative_to(self.model_root).as_posix()}"
            body = orjson.dumps({"model_name": name, "url": url})
            headers = {"Content-Type": "application/json", TARGET: target}
            async with serve.session.post(f"{serve.child.url}/models", data=body, headers=headers) as resp:
                payload = await resp.read()
                status = resp.status
            if status == 507 and await self._unload_lru(serve):
                continue  # memory pressure: make room and try again, as SageMaker does
            if status != 200:
                return _model_error(status, payload, self.endpoint_name)
            return None

    async def ensure_loaded(self, serve: _Serve, target: str) -> str | Response:
        """The loaded model's name in serve, or the answer that says why it could not be loaded."""
        name = model_hash(target)
        if name in self.loaded.order:
            self.loaded.order.move_to_end(name)
            return name
        async with self.lock:
            if name in self.loaded.order:
                return name
            model_dir = self.model_root / name / "model"
            if (refused := await self._extract(target, model_dir)) is not None:
                return refused
            while len(self.loaded.order) >= self.loaded.capacity and await self._unload_lru(serve):
                pass
            failed = await self._load(serve, name, target, model_dir)
            if failed is not None:
                await _remove(model_dir.parent)  # the next request fetches the archive again
                return failed
            self.loaded.order[name] = target
            self.loaded.loads += 1
            return name


async def _remove(path: Path) -> None:
    """Remove a folder tree off the event loop (a model's files can be large)."""
    await asyncio.to_thread(shutil.rmtree, path, ignore_errors=True)


def create_app(
    endpoint_name: str,
    child: ServeProcess,
    work_dir: Path,
    source: ArchiveSource | None,
    capacity: int,
    model_url_root: str | None = None,
    limits: ExtractLimits | None = None,
) -> FastAPI:
    """The emulator app in front of ``child``, a started `serve` (a process or the image) that its caller
    stops; `source` None means a single-model endpoint (no TargetModel accepted). ``model_url_root`` is
    where serve sees ``work_dir/models`` (the image mounts it elsewhere); ``limits`` bound each archive
    extracted."""
    loaded = LoadedModels(capacity)
    placement = None
    if source is not None:
        placement = _Placement(endpoint_name, work_dir, source, loaded, model_url_root, limits)

    @contextlib.asynccontextmanager
    async def lifespan(started: FastAPI) -> AsyncIterator[None]:
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        started.state.serve = _Serve(child, session)
        try:
            yield
        finally:
            await session.close()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.post("/endpoints/{name}/invocations")
    async def invoke(name: str, request: Request) -> Response:
        if name != endpoint_name:
            return _service_error(400, "ValidationError", f"Endpoint {name} of account 000000000000 not found.")
        serve: _Serve = request.app.state.serve
        body = await request.body()
        headers = {k: v for k in PASSED_HEADERS if (v := request.headers.get(k)) is not None}
        headers["Content-Type"] = request.headers.get("content-type", "application/octet-stream")
        target = request.headers.get(TARGET)
        if target is None:
            if placement is not None:
                return _service_error(400, "ValidationError", "TargetModel is required for a multi-model endpoint")
            url = f"{serve.child.url}/invocations"
        else:
            if placement is None:
                return _service_error(400, "ValidationError", "TargetModel is only for multi-model endpoints")
            loaded_name = await placement.ensure_loaded(serve, target)
            if isinstance(loaded_name, Response):
                return loaded_name
            headers[TARGET] = target
            url = f"{serve.child.url}/models/{loaded_name}/invoke"
        async with serve.session.post(url, data=body, headers=headers) as resp:
            payload = await resp.read()
            if resp.status != 200:
                return _model_error(resp.status, payload, endpoint_name)
            return Response(payload, status_code=200, headers=_answer_headers(resp.headers))

    @app.get("/ping")
    async def ping(request: Request) -> Response:
        """Emulator-only readiness: 200 while serve answers its own /ping with 200, else 503."""
        serve: _Serve = request.app.state.serve
        try:
            async with serve.session.get(f"{serve.child.url}/ping", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                healthy = resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            healthy = False
        return Response(b"", status_code=200 if healthy else 503)

    @app.get("/_local/models")
    async def status() -> Response:
        """Emulator-only: what is loaded (LRU first) and how many loads and evictions happened."""
        body = {"loaded": list(loaded.order.values()), "loads": loaded.loads, "evictions": loaded.evictions}
        return Response(orjson.dumps(body), media_type="application/json")

    return app
