"""requirements-dev.lock (what developers and CI install) pins the runtime as the image ships it."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.markers import Marker, default_environment
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def _pins(lock: Path, python: str) -> dict[str, str]:
    """name -> version of every pin in ``lock`` whose marker holds for CPython ``python`` on Linux."""
    env = default_environment() | {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
    pins: dict[str, str] = {}
    for raw in lock.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        requirement, _, marker = line.partition(";")
        if marker.strip() and not Marker(marker.strip()).evaluate(env):
            continue
        name, _, version = requirement.strip().partition("==")
        assert version, f"{lock.name}: '{line}' is not an exact pin"
        assert canonicalize_name(name) not in pins, f"{lock.name}: {name} is pinned twice for Python {python}"
        pins[canonicalize_name(name)] = version
    return pins


@pytest.mark.parametrize("python", ["3.10", "3.11", "3.12"])
def test_the_dev_lock_has_every_runtime_pin_at_the_image_version(python):
    runtime = _pins(ROOT / "requirements.lock", python)
    dev = _pins(ROOT / "requirements-dev.lock", python)
    assert runtime  # the parser found the pins
    differ = {name: (version, dev.get(name)) for name, version in runtime.items() if dev.get(name) != version}
    assert differ == {}, (
        f"(requirements.lock, requirements-dev.lock) differ: regenerate the dev lock (its header): {differ}"
    )


def test_the_dev_lock_says_how_it_is_regenerated_under_the_runtime_lock():
    header = (ROOT / "requirements-dev.lock").read_text().split("\n", 3)[:2]
    assert "uv pip compile pyproject.toml" in header[1]
    assert "--constraint requirements.lock" in header[1]
