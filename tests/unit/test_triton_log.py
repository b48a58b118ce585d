"""Triton's log lines keep their level in serve's log, except the notices every GPU-less host gets."""

from __future__ import annotations

import logging

import pytest

from smtriton.serve.triton.process import _log_level


@pytest.mark.parametrize(
    ("line", "level"),
    [
        ('I1122 13:22:39.711541 12253 server.cc:674] "model ready"', logging.INFO),
        ('W1122 13:22:39.711541 12253 model.cc:12] "slow"', logging.WARNING),
        ('E1122 13:22:39.711541 12253 model.cc:12] "failed to load"', logging.ERROR),
        ('F1122 13:22:39.711541 12253 server.cc:12] "abort"', logging.CRITICAL),
        ("| pinned_memory_pool_byte_size | 268435456 |", logging.INFO),
        ('E1122 13:22:39.711679 12253 server.cc:241] "CudaDriverHelper has not been initialized."', logging.INFO),
        (
            'W1122 13:22:39.711541 12253 pinned_memory_manager.cc:273] "Unable to allocate pinned system memory, '
            'pinned memory pool will not be available: CUDA driver version is insufficient for CUDA runtime version"',
            logging.INFO,
        ),
    ],
)
def test_levels(line, level):
    assert _log_level(line) == level
