"""Prototype fronts, measured beside ``serve`` to tell which hot-path changes pay (bench/NOTES.md).

Each forwards ``/invocations`` bodies untouched to a loopback Triton, as ``serve`` does, and implements
only what the benchmark exercises (no limits, no error mapping): they bound what a front can reach, they
are not products. ``--servers x-<name>`` runs one; the Triton behind it is started like the proxy's.

name: (how it is started, target, uvicorn/processes workers)
"""

EXPERIMENTS: dict[str, tuple[str, str, int]] = {
    # The reference pass-through of docs/design.md §5: raw ASGI app, aiohttp pool to Triton.
    "asgi-aiohttp": ("uvicorn", "bench.experiments.asgi_aiohttp:app", 1),
    # Raw ASGI app, a minimal asyncio/httptools keep-alive client to Triton.
    "asgi-lean": ("uvicorn", "bench.experiments.asgi_lean:app", 1),
    "asgi-lean-w2": ("uvicorn", "bench.experiments.asgi_lean:app", 2),
    # No ASGI, no uvicorn: an asyncio Protocol server (httptools) and the same client.
    "proto": ("module", "bench.experiments.proto", 1),
    "proto-w2": ("module", "bench.experiments.proto", 2),
    # proto, transcoding large JSON requests to Triton's binary form (orjson + numpy) in the front.
    "proto-transcode": ("module", "bench.experiments.proto_transcode", 1),
    "proto-transcode-w2": ("module", "bench.experiments.proto_transcode", 2),
    # serve itself (its own Triton, its flags), with the garbage collector frozen after imports.
    "serve-gc-frozen": ("serve", "bench.experiments.serve_gc_frozen", 1),
    # serve itself, never re-encoding large JSON requests binary (SMTRITON_TRANSCODE_JSON_MIN_BYTES=0).
    "serve-no-transcode": ("serve", "bench.experiments.serve_no_transcode", 1),
    # serve itself, uvicorn pausing body reads only past 4 MiB buffered (not 64 KiB).
    "serve-big-reads": ("serve", "bench.experiments.serve_big_reads", 1),
    # serve itself, the data routes served through uvicorn's ASGI cycle (no protocol-level fast path).
    "serve-asgi": ("serve", "bench.experiments.serve_asgi", 1),
    # serve itself, inference requests sent to Triton by the minimal client of upstream.py, not aiohttp.
    "serve-lean-upstream": ("serve", "bench.experiments.serve_lean_upstream", 1),
    # serve itself, recording the collector's pauses to $BENCH_GC_STATS at exit.
    "serve-gc-stats": ("serve", "bench.experiments.serve_gc_stats", 1),
}
