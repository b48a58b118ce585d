"""Where a run sends its requests: serve (or anything speaking the contract) by URL, or a SageMaker endpoint.

A URL target speaks HTTP/1.1 itself over asyncio, one keep-alive connection per channel, with requests
pre-rendered to bytes and responses parsed by httptools (the parser uvicorn uses): per request the
client only writes bytes and reads a status, so one client core keeps up with thousands of requests a
second. An endpoint target calls boto3's ``sagemaker-runtime`` ``invoke_endpoint`` (SigV4, TargetModel)
in a thread pool, as an application would.
"""

from __future__ import annotations

import asyncio
import http.client
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

import httptools

from smtriton.errors import ToolError, ToolUsageError
from smtriton.perf.bodies import Body

TARGET_MODEL_HEADER = "X-Amzn-SageMaker-Target-Model"
PING_TIMEOUT_S = 10.0
# A refused connection is retried after this pause: a server that is gone costs the client no spin.
RECONNECT_PAUSE_S = 0.05


class Channel(Protocol):
    """One lane of requests: a request at a time; the status it got back (0: no answer)."""

    async def send(self, index: int) -> int: ...

    def close(self) -> None: ...


class Target(Protocol):
    description: str

    def check(self) -> None:
        """Raise a :class:`ToolError` saying so when nothing answers there, before any step runs."""
        ...

    async def channel(self) -> Channel: ...

    def close(self) -> None: ...


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def render_request(host: str, path: str, body: Body, target_model: str | None) -> bytes:
    """The full bytes of one keep-alive POST."""
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}",
        f"Content-Type: {body.content_type}",
        f"Content-Length: {len(body.data)}",
        "Accept: */*",
    ]
    if target_model:
        head.append(f"{TARGET_MODEL_HEADER}: {target_model}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body.data


class _Connection(asyncio.Protocol):
    """A keep-alive HTTP/1.1 connection that answers each request's status through a future."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are no asyncio subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._fail()

    def on_message_complete(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(self.parser.get_status_code())
        if not self.parser.should_keep_alive():
            self._fail()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._fail()

    def _fail(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(0)
        if self.transport is not None:
            self.transport.close()
            self.transport = None


class HttpChannel:
    """One keep-alive connection, reopened after the server closes it or it fails."""

    def __init__(self, host: str, port: int, requests: Sequence[bytes]) -> None:
        self.host, self.port = host, port
        self.requests = requests
        self.count = len(requests)
        self.conn: _Connection | None = None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Connection, self.host, self.port)
        return conn

    async def send(self, index: int) -> int:
        conn = self.conn
        if conn is None or conn.transport is None:
            try:
                conn = self.conn = await self._connect()
            except OSError:  # refused: no server (yet, or any more); wait a moment before the next try
                self.conn = None
                await asyncio.sleep(RECONNECT_PAUSE_S)
                return 0
        assert conn.transport is not None
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        conn.waiter = waiter
        conn.transport.write(self.requests[index % self.count])
        return await waiter

    def close(self) -> None:
        if self.conn is not None and self.conn.transport is not None:
            self.conn.transport.close()
        self.conn = None


class HttpTarget:
    """serve, or the local endpoint's serve, by URL: POST /invocations or /models/<target-model>/invoke."""

    def __init__(self, url: str, bodies: Sequence[Body], target_model: str | None) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ToolUsageError(f"{url}: perf speaks plain http:// to a local server (an endpoint: give its name)")
        self.host = parts.hostname
        self.port = parts.port or 80
        base = self.base = parts.path.rstrip("/")
        path = f"{base}/models/{target_model}/invoke" if target_model else f"{base}/invocations"
        self.description = f"POST http://{self.host}:{self.port}{path}"
        host_header = f"{self.host}:{self.port}"
        self.requests = [render_request(host_header, path, b, target_model) for b in bodies]
        self.channels: list[HttpChannel] = []

    def check(self) -> None:
        """``GET /ping`` once: a server that is not there, or not ready, is one line instead of a run of
        refused connections."""
        url = f"http://{self.host}:{self.port}{self.base}/ping"
        connection = http.client.HTTPConnection(self.host, self.port, timeout=PING_TIMEOUT_S)
        try:
            connection.request("GET", f"{self.base}/ping")
            status = connection.getresponse().status
        except (OSError, http.client.HTTPException) as exc:  # refused, timed out, or no HTTP answer
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise ToolError(f"nothing answers GET {url} ({reason}): start serve there first") from None
        finally:
            connection.close()
        if status != 200:
            raise ToolError(f"GET {url} answered {status}: no serve ready for requests there (serve answers 200 once "
                            "its model is loaded)")  # fmt: skip

    async def channel(self) -> Channel:
        ch = HttpChannel(self.host, self.port, self.requests)
        self.channels.append(ch)
        return ch

    def close(self) -> None:
        for ch in self.channels:
            ch.close()
        self.channels.clear()


class EndpointTarget:
    """A SageMaker endpoint through boto3's ``invoke_endpoint``, in a pool of ``workers`` threads.

    Retries are off, so every throttle or error is counted as the status it came back with.
    """

    def __init__(
        self,
        endpoint: str,
        bodies: Sequence[Body],
        *,
        target_model: str | None,
        endpoint_url: str | None,
        region: str | None,
        workers: int,
    ) -> None:
        from botocore.config import Config

        from smtriton.aws.session import aws_session

        config = Config(max_pool_connections=workers, retries={"total_max_attempts": 1, "mode": "standard"})
        # No region or credentials (a local endpoint URL needs neither): one line, before any request.
        session = aws_session(region, endpoint_url=endpoint_url)
        try:
            self.client = session.client("sagemaker-runtime", endpoint_url=endpoint_url, config=config)
        except ValueError as exc:  # botocore's refusal of a URL it cannot use
            raise ToolUsageError(f"--endpoint-url {endpoint_url}: {exc}") from None
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="perf-invoke")
        self.bodies = list(bodies)
        self.kwargs: list[dict[str, Any]] = []
        for b in self.bodies:
            kw: dict[str, Any] = {"EndpointName": endpoint, "Body": b.data, "ContentType": b.content_type}
            if target_model:
                kw["TargetModel"] = target_model
            self.kwargs.append(kw)
        where = endpoint_url or "SageMaker Runtime"
        self.description = f"invoke_endpoint {endpoint}" + (f" TargetModel={target_model}" if target_model else "")
        self.description += f" ({where})"

    def check(self) -> None:
        """One request first: an endpoint URL nothing listens at is one line instead of a run of failed
        connections (any answer, an error status included, is measured as the steps go)."""
        from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

        try:
            self.client.invoke_endpoint(**self.kwargs[0])["Body"].read()
        except EndpointConnectionError as exc:
            raise ToolError(f"nothing answers: {exc}") from None
        except (ClientError, BotoCoreError, OSError):
            pass

    def _invoke(self, index: int) -> int:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self.client.invoke_endpoint(**self.kwargs[index % len(self.kwargs)])
            response["Body"].read()
            return int(response["ResponseMetadata"]["HTTPStatusCode"])
        except ClientError as exc:
            return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        except (BotoCoreError, OSError):
            return 0

    async def channel(self) -> Channel:
        return _EndpointChannel(self)  # every channel shares the client and its thread pool

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


class _EndpointChannel:
    def __init__(self, target: EndpointTarget) -> None:
        self.target = target

    async def send(self, index: int) -> int:
        return await asyncio.get_running_loop().run_in_executor(self.target.executor, self.target._invoke, index)

    def close(self) -> None:
        """Nothing to close: the target owns the client and the pool."""
