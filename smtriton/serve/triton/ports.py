"""Loopback ports for Triton that no other process holds (inside SAGEMAKER_SAFE_PORT_RANGE if set)."""

from __future__ import annotations

import random
import socket

LOOPBACK = "127.0.0.1"


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def pick_port(safe_range: tuple[int, int] | None, exclude: set[int]) -> int:
    """A port free right now; the caller retries with another if Triton still loses the race to bind it."""
    if safe_range is None:
        for _ in range(64):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((LOOPBACK, 0))
                port = int(sock.getsockname()[1])
            if port not in exclude:
                return port
        raise OSError("no free ephemeral loopback port")
    low, high = safe_range
    candidates = [p for p in range(low, high + 1) if p not in exclude]
    random.shuffle(candidates)  # two instances sharing a range should not march in lockstep
    for port in candidates:
        if _is_free(port):
            return port
    raise OSError(f"no free loopback port in SAGEMAKER_SAFE_PORT_RANGE {low}-{high}")
