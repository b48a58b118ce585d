"""Where the tritonserver binary comes from, and what environment it needs to run.

Order: ``TRITONSERVER`` (a path), NVIDIA's image (``/opt/tritonserver/bin/tritonserver``), then the
binary shipped inside the ``nvidia-pytriton`` wheel. The wheel's binary needs extra care: its libraries
live in ``nvidia_pytriton.libs``, and its Python backend has no stub in place — the stub for the running
Python must be copied in, and it must load *this* interpreter's libpython and import this venv's
packages (so the venv's ``bin`` goes first on ``PATH``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from smtriton.serve.errors import StartupError

NGC_BINARY = Path("/opt/tritonserver/bin/tritonserver")


class TritonNotFound(StartupError):
    """No usable tritonserver binary on this host."""


@dataclass(frozen=True)
class TritonInstallation:
    """A tritonserver binary, its native backends directory and the environment it runs in."""

    binary: Path
    backends: Path | None
    python_stub: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    def native_backends(self) -> set[str]:
        """Backend names this binary can run natively (a directory holding a ``libtriton_*.so``)."""
        if self.backends is None or not self.backends.is_dir():
            return set()
        return {d.name for d in self.backends.iterdir() if d.is_dir() and (d / f"libtriton_{d.name}.so").exists()}


def _prepend(env: dict[str, str], name: str, *paths: str) -> None:
    existing = env.get(name, os.environ.get(name, ""))
    env[name] = os.pathsep.join([*paths, *([existing] if existing else [])])


def _path_env() -> dict[str, str]:
    """Python models import this environment's packages: its ``bin`` goes first on PATH."""
    env: dict[str, str] = {}
    _prepend(env, "PATH", str(Path(sys.executable).parent))
    return env


def _interpreter_env() -> dict[str, str]:
    """Make a copied Python backend stub load this interpreter's libpython (and this venv's packages)."""
    env = _path_env()
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir and Path(libdir).is_dir():
        _prepend(env, "LD_LIBRARY_PATH", libdir)
    return env


def _from_pytriton_wheel() -> TritonInstallation | None:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    binary = root / "bin" / "tritonserver"
    if not binary.exists():
        return None
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    env = _interpreter_env()
    libs = root.parent.parent / "nvidia_pytriton.libs"
    # After the interpreter's libdir: the stub's own libpython must not win over ours.
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (env.get("LD_LIBRARY_PATH"), str(libs)) if p)
    return TritonInstallation(
        binary=binary, backends=root / "backends", python_stub=stub if stub.exists() else None, env=env
    )


def _from_binary(binary: Path) -> TritonInstallation:
    backends = binary.resolve().parent.parent / "backends"
    return TritonInstallation(binary=binary, backends=backends if backends.is_dir() else None, env=_path_env())


def find_triton(explicit: Path | None = None) -> TritonInstallation:
    """Locate tritonserver; ``explicit`` is the ``TRITONSERVER`` setting."""
    if explicit is not None:
        if not (explicit.is_file() and os.access(explicit, os.X_OK)):
            raise TritonNotFound(f"TRITONSERVER={explicit} is not an executable file")
        return _from_binary(explicit)
    if NGC_BINARY.exists():
        return _from_binary(NGC_BINARY)
    wheel = _from_pytriton_wheel()
    if wheel is not None:
        return wheel
    raise TritonNotFound(
        "no tritonserver found: set TRITONSERVER, run in NVIDIA's Triton image, "
        "or install the local extra (pip install 'smtriton[local]', which ships nvidia-pytriton)"
    )
