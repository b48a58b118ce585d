"""Hypothesis profiles: few examples for a quick local run, the full counts in CI.

``HYPOTHESIS_PROFILE`` picks one by name; without it, CI (``CI=true``) runs "ci" and everyone else "dev".
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("dev", max_examples=50)
settings.register_profile("ci", max_examples=1500, print_blob=True)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI", "").lower() == "true" else "dev")
)

# The image tests need a built image (scripts/image-test.sh builds it and names it here).
collect_ignore = [] if os.environ.get("SMTRITON_TEST_IMAGE") else ["image"]
