"""A short soak in CI; the full one is `python -m tests.integration.soak` (5 minutes at concurrency 32)."""

import pytest

from tests.integration.soak import soak

pytestmark = pytest.mark.integration


def test_short_soak_has_no_errors_and_flat_memory():
    result = soak(seconds=30, concurrency=32)
    assert result.requests > 1000
    assert result.errors == []
    assert result.growth < 0.05, (result.rss_start_kib, result.rss_end_kib)
