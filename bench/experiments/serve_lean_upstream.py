"""``serve`` unchanged, except that inference requests reach Triton through the minimal keep-alive
client of ``bench/experiments/upstream.py`` instead of aiohttp: how much of a large body's front CPU is
aiohttp's. No timeouts or error mapping: a measurement, not a product. Same flags as ``serve``."""

import socket
from urllib.parse import urlsplit

import smtriton.serve.http.worker
from bench.experiments import serve_variant
from bench.experiments.upstream import Upstream
from smtriton.serve.triton.client import TritonClient, UpstreamResponse

_clients: dict[tuple[str, str], Upstream] = {}


async def _infer(self: TritonClient, model: str, body: bytes, header_length: int | None) -> UpstreamResponse:
    upstream = _clients.get((self.base_url, model))
    if upstream is None:
        address = urlsplit(self.base_url)
        upstream = _clients[(self.base_url, model)] = Upstream(address.hostname or "", address.port or 80, model)
    status, raw_length, payload = await upstream.infer(body, header_length)
    return UpstreamResponse(status, "", int(raw_length) if raw_length is not None else None, payload)


def _lean() -> None:
    TritonClient.infer = _infer  # type: ignore[method-assign]


def worker(index: int, channel: socket.socket) -> None:
    _lean()
    smtriton.serve.http.worker.run(index, channel)


if __name__ == "__main__":
    serve_variant.run("bench.experiments.serve_lean_upstream:worker")
