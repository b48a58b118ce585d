"""Triton's log lines keep their level in serve's log, except the notices every GPU-less host gets."""

from __future__ import annotations

import logging

import pytest

from smtriton.serve.triton import process
from smtriton.serve.triton.process import _log_level, _log_line


@pytest.mark.parametrize(
    ("line", "level"),
    [
        ('I1122 13:22:39.711541 12253 server.cc:674] "model ready"', logging.INFO),
        ('W1122 13:22:39.711541 12253 model.cc:12] "slow"', logging.WARNING),
        ('E1122 13:22:39.711541 12253 model.cc:12] "failed to load"', logging.ERROR),
        ('F1122 13:22:39.711541 12253 server.cc:12] "abort"', logging.CRITICAL),
        ("| pinned_memory_pool_byte_size | 268435456 |", logging.INFO),
        ('E1122 13:22:39.711679 12253 server.cc:241] "CudaDriverHelper has not been initialized."', logging.DEBUG),
        (
            'W1122 13:22:39.711541 12253 pinned_memory_manager.cc:273] "Unable to allocate pinned system memory, '
            'pinned memory pool will not be available: CUDA driver version is insufficient for CUDA runtime version"',
            logging.DEBUG,
        ),
        (
            'E1126 09:12:01.101112 4242 ensemble_scheduler.cc:1468] "unable to create stream for tv_pipeline: '
            'CUDA driver version is insufficient for CUDA runtime version"',
            logging.DEBUG,
        ),
        (  # a stream that fails for another reason stays an error
            'E1126 09:12:01.101112 4242 ensemble_scheduler.cc:1468] "unable to create stream for tv_pipeline: '
            'out of memory"',
            logging.ERROR,
        ),
    ],
)
def test_levels(line, level):
    assert _log_level(line) == level


def test_the_gpu_notices_are_explained_once_at_info_and_kept_at_debug(caplog, monkeypatch):
    monkeypatch.setattr(process, "_explained", [])
    caplog.set_level(logging.DEBUG)
    for _ in range(2):
        _log_line(b'E1122 13:22:39.711679 12253 server.cc:241] "CudaDriverHelper has not been initialized."\n')
    explained = [r for r in caplog.records if r.levelno == logging.INFO]
    assert [r.getMessage() for r in explained] == [
        "Triton finds no usable GPU here: its notices about CUDA are expected, and logged at debug level"
    ]
    assert [r.levelno for r in caplog.records if r.name == "triton"] == [logging.DEBUG, logging.DEBUG]
