"""A load's ``url``: confined to the model root, resolved strictly, and shown in its canonical form
(docs/contract.md §4.2, §6 B1)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from smtriton.model_config import CONFIG_FILE
from smtriton.serve.errors import BadRequest, readable

# Longer than any path the kernel resolves: refused before it is looked at.
MAX_URL_LENGTH = 4096


def _shown(url: str) -> str:
    """A url as a message shows it: one of thousands of characters is cut."""
    return url if len(url) <= 200 else f"{url[:120]}...{url[-60:]}"


def _real(path: Path, url: str, what: str) -> Path:
    """``path`` resolved strictly (every link followed to the end); a loop, a path too long or a link
    to nothing is the caller's mistake, said in one line."""
    try:
        return Path(os.path.realpath(path, strict=True))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BadRequest(f"url '{_shown(url)}' {what} a loop of symlinks") from None
        if exc.errno == errno.ENAMETOOLONG:
            raise BadRequest(f"url '{_shown(url)}' {what} a path too long to resolve") from None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR) and what == "is":
            raise BadRequest(f"failed to register '{_shown(url)}', repository not found") from None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise BadRequest(f"url '{_shown(url)}' {what} a symlink that leads nowhere") from None
        raise BadRequest(f"url '{_shown(url)}' cannot be read: {exc.strerror or exc}") from None


def confine_url(url: object, model_root: Path) -> Path:
    """The url as a real directory strictly inside ``model_root``; refuses '..', links out, links that
    loop or lead nowhere, other roots, the model root itself (whose every model it would walk) and a real
    path that is not UTF-8."""
    if not isinstance(url, str) or not url:
        raise BadRequest("'url' must be a non-empty string")
    if len(url) > MAX_URL_LENGTH:
        raise BadRequest(f"url '{_shown(url)}' is longer than {MAX_URL_LENGTH} characters")
    path = Path(url)
    if not path.is_absolute() or ".." in path.parts or "\0" in url:
        raise BadRequest(f"url '{_shown(url)}' must be an absolute path under {model_root} without '..'")
    root = model_root.resolve()
    real = _real(path, url, "is")
    if real == root:
        raise BadRequest(f"url '{_shown(url)}' is the model root itself: give one model's folder under it")
    if root not in real.parents:
        raise BadRequest(f"url '{_shown(url)}' is not under the model root {model_root}")
    try:
        str(real).encode()
    except UnicodeEncodeError:  # the model's record and its list show where it lies
        raise BadRequest(f"url '{_shown(url)}' resolves to a path that is not UTF-8: '{readable(str(real))}'") from None
    if not real.is_dir():
        raise BadRequest(f"failed to register '{_shown(url)}', repository not found")
    for dirpath, dirnames, filenames in os.walk(real):
        for entry in (*dirnames, *filenames):
            candidate = Path(dirpath) / entry
            if candidate.is_symlink():
                target = _real(candidate, url, "holds")
                if target != real and real not in target.parents:
                    raise BadRequest(f"url '{_shown(url)}' holds a symlink that leads outside it: {readable(entry)}")
    return real


def canonical_url(real: Path, model_root: Path) -> Path:
    """Where ``real`` (a confined url) lies, spelt from the model root as configured: aliases such as
    ``/proc/self/root/...``, doubled slashes and links on the way are gone."""
    return model_root / real.relative_to(model_root.resolve())


def listed_url(real: Path, model_root: Path) -> str:
    """The url as `GET /models` shows it, as NVIDIA's front end does, in its canonical form: a url that
    is itself a model directory (holds config.pbtxt) is registered as its parent repository, and listed
    so: the ``/model`` that SageMaker appends is dropped."""
    canonical = canonical_url(real, model_root)
    return str(canonical.parent if (real / CONFIG_FILE).is_file() else canonical)
