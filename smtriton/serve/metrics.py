"""Prometheus metrics of the front server, plus Triton's own, on a port of their own.

Off unless ``SMTRITON_METRICS_PORT`` is set: then the main process serves ``/metrics`` with the
counters and histograms of every process of `serve` summed (prometheus_client's multiprocess mode:
each process writes its values to files in one directory, named by ``PROMETHEUS_MULTIPROC_DIR``
before prometheus_client is first imported) and, re-exported at each scrape, Triton's ``nv_*``
metrics (Triton's metrics endpoint stays on loopback). The hot path pays one dict lookup and two
label-child updates per request.
"""

from __future__ import annotations

import logging
import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("serve.metrics")

MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _TritonCollector:
    """Fetches Triton's own metrics at scrape time (from the scrape thread, never the event loop)."""

    def __init__(self, url: Callable[[], str | None]) -> None:
        self._url = url

    def collect(self) -> Iterator[Metric]:
        url = self._url()
        if url is None:
            return
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                text = resp.read().decode()
        except OSError:
            return
        yield from text_string_to_metric_families(text)


def share_between_processes(directory: Path) -> None:
    """Have every process of `serve` started from now on write its metrics to ``directory``; call it in
    the main process before prometheus_client is imported (the workers inherit the variable)."""
    directory.mkdir(parents=True, exist_ok=True)
    os.environ[MULTIPROCESS_DIR] = str(directory)


class Metrics:
    """Counters of one `serve` process; ``enabled`` False makes every method a no-op."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.registry = CollectorRegistry()
        labels = ["route", "model", "status"]
        self._requests = Counter(
            "smtriton_requests", "Requests by route, model, status", labels, registry=self.registry
        )
        self._latency = Histogram(
            "smtriton_request_seconds",
            "Request latency in the front server",
            ["route", "model"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._inflight = Gauge(
            "smtriton_inflight_requests",
            "Requests being served",
            ["route"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self._loads = Counter("smtriton_model_loads", "MME model loads by result", ["result"], registry=self.registry)
        self._load_latency = Histogram(
            "smtriton_model_load_seconds",
            "MME model load latency",
            buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 300),
            registry=self.registry,
        )
        self._unloads = Counter("smtriton_model_unloads", "MME unloads by result", ["result"], registry=self.registry)
        self.triton_restarts = Counter("smtriton_triton_restarts", "Unexpected Triton exits", registry=self.registry)
        self.transcoded = Counter(
            "smtriton_transcoded_requests", "Large JSON requests re-encoded binary for Triton", registry=self.registry
        )
        self.through_shared_memory = Counter(
            "smtriton_shared_memory_requests",
            "Triton requests whose binary inputs went through the worker's shared memory, not the HTTP body",
            registry=self.registry,
        )
        self.merged_requests = Counter(
            "smtriton_merged_requests",
            "Requests answered from a Triton request that merged them with others",
            registry=self.registry,
        )
        self.merges = Counter("smtriton_merges", "Triton requests that merged several requests", registry=self.registry)
        self.unmerged_again = Counter(
            "smtriton_unmerged_again",
            "Requests sent again alone because their merged request failed or its answer could not be split",
            registry=self.registry,
        )
        self.merging_stopped = Counter(
            "smtriton_merging_stopped",
            "Times a worker stopped merging a model's requests: Triton executes a row of it in "
            "SMTRITON_MERGE_MAX_ROW_MS or more",
            registry=self.registry,
        )
        self.merging_resumed = Counter(
            "smtriton_merging_resumed",
            "Times a worker merged a model's requests again: Triton executes a row of it in under "
            "SMTRITON_MERGE_MAX_ROW_MS",
            registry=self.registry,
        )
        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    def serve(self, host: str, port: int, triton_url: Callable[[], str | None]) -> None:
        """``/metrics`` of every process (from the files of :func:`share_between_processes`) and Triton's."""
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=os.environ[MULTIPROCESS_DIR])  # type: ignore[no-untyped-call]
        registry.register(_TritonCollector(triton_url))
        start_http_server(port, addr=host, registry=registry)
        log.info("metrics on http://%s:%d/metrics", host, port)

    @staticmethod
    def forget_process(pid: int) -> None:
        """A worker exited: its live gauges (requests in flight) no longer count; its counters still do."""
        if MULTIPROCESS_DIR in os.environ:
            mark_process_dead(pid, os.environ[MULTIPROCESS_DIR])  # type: ignore[no-untyped-call]

    def begin(self, route: str) -> float:
        if self.enabled:
            self._inflight.labels(route).inc()
        return time.perf_counter()

    def end(self, route: str, model: str, status: int, started: float) -> None:
        if not self.enabled:
            return
        key = (route, model, status)
        children = self._children.get(key)
        if children is None:
            children = (self._requests.labels(route, model, str(status)), self._latency.labels(route, model))
            self._children[key] = children
        children[0].inc()
        children[1].observe(time.perf_counter() - started)
        self._inflight.labels(route).dec()

    def merged(self, requests: int) -> None:
        """One Triton request carried ``requests`` requests."""
        self.merges.inc()
        self.merged_requests.inc(requests)

    def model_load(self, ok: bool, seconds: float) -> None:
        if self.enabled:
            self._loads.labels("ok" if ok else "error").inc()
            self._load_latency.observe(seconds)

    def model_unload(self, ok: bool) -> None:
        if self.enabled:
            self._unloads.labels("ok" if ok else "error").inc()
