"""The client of Triton's loopback HTTP endpoint, one per worker.

Inference calls go through the worker's own keep-alive connections (:mod:`smtriton.serve.triton.infer_pool`,
leaner than aiohttp on the hot path: docs/design.md §5); everything else (control, generate) through one
aiohttp session, which forwards raw bytes several times faster than httpx. Bodies go through untouched,
and only headers are rewritten by the caller. How a call to Triton fails is the same for both: Triton
unreachable is 503, out of time the call's own error (:func:`_calling` for aiohttp's calls).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from urllib.parse import quote, urlsplit

import aiohttp
import orjson

from smtriton.serve.errors import (
    InternalError,
    ModelLoadFailed,
    ServeError,
    TritonUnavailable,
    UpstreamError,
    UpstreamTimeout,
)
from smtriton.serve.triton.access import TritonAccess
from smtriton.serve.triton.infer_pool import InferPool, UpstreamResponse
from smtriton.serve.triton.request_body import HeldBody, RequestBody

HEADER_LENGTH = "Inference-Header-Content-Length"

__all__ = ["RequestBody", "TritonClient", "UpstreamResponse", "error_text"]


@contextlib.contextmanager
def _calling(out_of_time: ServeError) -> Iterator[None]:
    """A call to Triton: a transport failure is 503 (Triton restarting or dead), running out of time is
    ``out_of_time``."""
    try:
        yield
    except asyncio.TimeoutError:
        raise out_of_time from None
    except aiohttp.ClientConnectorError as exc:  # no connection made: nothing reached Triton
        raise TritonUnavailable(f"Triton is not reachable: {exc.__class__.__name__}", sent=False) from None
    except aiohttp.ClientError as exc:
        raise TritonUnavailable(f"Triton is not reachable: {exc.__class__.__name__}") from None


class TritonClient:
    """Talks to one Triton HTTP endpoint; create once, share, close at shutdown. ``access`` is the header
    Triton's restricted APIs (repository, config, shared memory) want: sent on each call to them."""

    def __init__(
        self, base_url: str, request_timeout_s: float, pool_size: int = 256, access: TritonAccess | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._restricted = access.headers if access is not None else {}
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._probe_timeout = aiohttp.ClientTimeout(total=2.0)
        address = urlsplit(self.base_url)
        assert address.hostname is not None and address.port is not None
        self._infer_pool = InferPool(address.hostname, address.port, request_timeout_s, pool_size)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=pool_size, keepalive_timeout=60, ttl_dns_cache=None),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )

    async def close(self) -> None:
        await self._infer_pool.close()
        await self._session.close()

    def _model_url(self, model: str, suffix: str) -> str:
        return f"{self.base_url}/v2/models/{quote(model, safe='')}{suffix}"

    async def infer(self, model: str, body: HeldBody, header_length: int | None) -> UpstreamResponse:
        """POST the body to ``/v2/models/<model>/infer`` as is; ``header_length`` None means pure JSON.
        Triton unreachable or gone before its whole answer: 503; past the request timeout: 504."""
        answer = await self._infer_pool.infer(model, body, header_length)
        if answer.status != 200:
            return answer
        payload, length = without_repeated_parameters(answer.body, answer.header_length)
        if payload is answer.body:
            return answer
        return UpstreamResponse(answer.status, answer.content_type, length, payload)

    async def generate(self, model: str, body: RequestBody) -> UpstreamResponse:
        """POST a generate request (JSON in, JSON out) to ``/v2/models/<model>/generate``."""
        with _calling(UpstreamTimeout(f"generate on model '{model}' did not finish in time")):
            async with self._session.post(
                self._model_url(model, "/generate"),
                data=body,
                headers={"Content-Type": "application/json"},
                timeout=self._timeout,
            ) as resp:
                payload = await resp.read()
                return UpstreamResponse(resp.status, resp.headers.get("Content-Type", ""), None, payload)

    @contextlib.asynccontextmanager
    async def generate_stream(self, model: str, body: RequestBody) -> AsyncIterator[aiohttp.ClientResponse]:
        """Open ``/v2/models/<model>/generate_stream``; closing it early drops the connection, which
        is how Triton learns the client went away."""
        with _calling(UpstreamTimeout(f"generate on model '{model}' did not start in time")):
            resp = await self._session.post(
                self._model_url(model, "/generate_stream"),
                data=body,
                headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
                timeout=aiohttp.ClientTimeout(total=None, sock_read=self._timeout.total),
            )
        try:
            yield resp
        finally:
            if not resp.content.at_eof():
                resp.close()  # not back to the pool: the stream was cut
            resp.release()

    async def _get_ok(self, path: str) -> bool:
        try:
            async with self._session.get(f"{self.base_url}{path}", timeout=self._probe_timeout) as resp:
                await resp.read()
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False

    async def server_live(self) -> bool:
        return await self._get_ok("/v2/health/live")

    async def model_ready(self, model: str) -> bool | None:
        """Triton's answer on the model's readiness; None when Triton did not answer in time (a busy
        moment is not a verdict: the process watcher reports a dead Triton)."""
        try:
            async with self._session.get(self._model_url(model, "/ready"), timeout=self._probe_timeout) as resp:
                await resp.read()
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None

    async def model_config(self, model: str) -> dict[str, object]:
        """The model's configuration as Triton completed it (JSON)."""
        return await self._model_json(model, "/config", self._restricted)

    async def _model_json(self, model: str, suffix: str, headers: dict[str, str] | None = None) -> dict[str, object]:
        """One of Triton's JSON descriptions of a model (``GET /v2/models/<model><suffix>``)."""
        url = self._model_url(model, suffix)
        with _calling(TritonUnavailable("Triton did not answer in time")):
            async with self._session.get(url, headers=headers, timeout=self._probe_timeout) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise UpstreamError(resp.status, error_text(body))
                described: dict[str, object] = orjson.loads(body)
                return described

    async def shared_memory(self, region: str, key: str = "", byte_size: int = 0) -> None:
        """Register ``region``, the system shared memory ``key`` names (``byte_size`` bytes from its
        start), with Triton; without ``key``, unregister it."""
        action = "register" if key else "unregister"
        url = f"{self.base_url}/v2/systemsharedmemory/region/{quote(region, safe='')}/{action}"
        body = orjson.dumps({"key": key, "offset": 0, "byte_size": byte_size}) if key else b""
        with _calling(TritonUnavailable("Triton did not answer in time")):
            timeout = self._probe_timeout
            async with self._session.post(url, data=body, headers=self._restricted, timeout=timeout) as resp:
                answer = await resp.read()
                if resp.status != 200:
                    raise UpstreamError(resp.status, error_text(answer))

    async def model_metadata(self, model: str) -> dict[str, object]:
        """The model's inputs and outputs as Triton describes them (``GET /v2/models/<model>``)."""
        return await self._model_json(model, "")

    async def model_statistics(self, model: str) -> dict[str, object]:
        """Triton's statistics of the model (``GET /v2/models/<model>/stats``: counts and times of its
        requests and of its executions per batch size), every version loaded."""
        return await self._model_json(model, "/stats")

    async def is_decoupled(self, model: str) -> bool:
        """Whether a loaded model answers with a stream of responses (decoupled transaction policy)."""
        try:
            config = await self.model_config(model)
        except ServeError:
            return False
        policy = config.get("model_transaction_policy")
        return bool(isinstance(policy, dict) and policy.get("decoupled"))

    async def load_model(self, model: str, timeout_s: float) -> None:
        """Load (or reload) a model; raises ModelLoadFailed with Triton's message when it fails."""
        url = f"{self.base_url}/v2/repository/models/{quote(model, safe='')}/load"
        with _calling(UpstreamTimeout(f"loading model '{model}' did not finish within {timeout_s:.0f} s")):
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with self._session.post(url, headers=self._restricted, timeout=timeout) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise ModelLoadFailed(error_text(body))

    async def unload_model(self, model: str, unload_dependents: bool = False) -> None:
        """Ask Triton to unload; it answers at once, so callers wait with ``model_states``."""
        url = f"{self.base_url}/v2/repository/models/{quote(model, safe='')}/unload"
        payload = orjson.dumps({"parameters": {"unload_dependents": unload_dependents}})
        with _calling(InternalError(f"unloading model '{model}' timed out")):
            async with self._session.post(
                url, data=payload, headers=self._restricted, timeout=self._probe_timeout
            ) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise InternalError(f"unloading model '{model}' failed: {error_text(body)}")

    async def model_states(self) -> dict[str, str]:
        """Triton model name → state (READY, LOADING, UNLOADING, UNAVAILABLE) from the repository index."""
        return {name: state for name, (state, _) in (await self._repository_index()).items()}

    async def model_state(self, model: str) -> tuple[str | None, str]:
        """The model's state in the repository index and Triton's reason for it (None: not listed)."""
        state, reason = (await self._repository_index()).get(model, (None, ""))
        return state, reason

    async def _repository_index(self) -> dict[str, tuple[str, str]]:
        url = f"{self.base_url}/v2/repository/index"
        with _calling(TritonUnavailable("Triton did not answer in time")):
            async with self._session.post(
                url, data=b"{}", headers=self._restricted, timeout=self._probe_timeout
            ) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise InternalError(f"repository index failed: {error_text(body)}")
        index: dict[str, tuple[str, str]] = {}
        for entry in orjson.loads(body):
            index[entry["name"]] = (str(entry.get("state", "UNAVAILABLE")), str(entry.get("reason", "")))
        return index


_PARAMETERS = b'"parameters":{'
_OUTPUTS = b'"outputs":'
# Where the answer's own "parameters" may start: after the id (a client's, of any length, rarely long),
# the model's name and version; further in, "parameters" are an output's.
_PARAMETERS_WITHIN = 64 * 1024


def without_repeated_parameters(body: bytes, header_length: int | None) -> tuple[bytes, int | None]:
    """Triton's answer with each of its ``parameters`` once (and the JSON header's new length).

    Triton's ensemble scheduler adds ``sequence_id``, ``sequence_start`` and ``sequence_end`` to the
    ensemble's answer once per output tensor, so an ensemble with two outputs answers each key twice in
    one JSON object. Only the answer-level object is read (a few bytes before ``outputs``); an answer
    without repeated keys is returned as the same bytes.
    """
    end = len(body) if header_length is None else min(header_length, len(body))
    outputs = body.find(_OUTPUTS, 0, min(end, _PARAMETERS_WITHIN))
    start = body.find(_PARAMETERS, 0, outputs) if outputs > 0 else -1
    if start < 0:
        return body, header_length
    begin = start + len(_PARAMETERS) - 1  # at the object's "{"
    try:
        segment = body[begin:outputs].decode()
        pairs, stop = json.JSONDecoder(object_pairs_hook=list).raw_decode(segment)
    except ValueError:  # UnicodeDecodeError included: then it is no answer of Triton's to touch
        return body, header_length
    kept = dict(pairs)
    if len(kept) == len(pairs):
        return body, header_length
    cleaned = orjson.dumps(kept)
    replaced = len(segment[:stop].encode())
    shorter = replaced - len(cleaned)
    rest = body[begin + replaced :]
    return body[:begin] + cleaned + rest, None if header_length is None else header_length - shorter


def error_text(body: bytes) -> str:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", errors="replace")
    message = value.get("error") if isinstance(value, dict) else None
    if isinstance(message, str):
        return message
    return body.decode("utf-8", errors="replace")
