"""The names of a multi-model load: what its body says, and what Triton calls each model it stages
(docs/contract.md §4.1)."""

from __future__ import annotations

import hashlib
import re

import orjson

from smtriton.serve.errors import BadRequest, readable

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
# Between an archive's Triton name and a folder of it: never in an entry's Triton name (those are
# [A-Za-z0-9._-] only), so a folder's name cannot meet an entry's, nor another archive's folders;
# and unreserved in a URL, so Triton's API takes it as it is.
FOLDER_SEPARATOR = "~"
NAME_MAX = 255


def validate_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise BadRequest(f"invalid {what}: must be 1-255 characters of letters, digits, '.', '_' or '-'")
    return name


def utf8_folder(name: str) -> str:
    """An archive's folder name (as ``os`` gives it), refused with a 400 naming it when it is not UTF-8:
    the model's record, its Triton names and every answer naming it are UTF-8 text."""
    try:
        name.encode()
    except UnicodeEncodeError:
        raise BadRequest(
            f"model folder '{readable(name)}' of the archive has a name that is not UTF-8: rename it and package "
            "the archive again"
        ) from None
    return name


def parse_load_body(body: bytes) -> tuple[str, str]:
    """(model_name, url) from a load request; anything malformed is 400 (native aborts: docs/contract.md §6 B3)."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadRequest("load request body must be a JSON object with 'model_name' and 'url'") from None
    if not isinstance(value, dict):
        raise BadRequest("load request body must be a JSON object with 'model_name' and 'url'")
    name = validate_name(value.get("model_name"), "model_name")
    url = value.get("url")
    if not isinstance(url, str) or not url:
        raise BadRequest("'url' must be a non-empty string")
    return name, url


def triton_name_for(model_name: str, target_model: str | None) -> tuple[str, str]:
    """(Triton name, name responses show): native serves a model under its TargetModel header."""
    if target_model is None:
        return model_name, model_name
    if _NAME.fullmatch(target_model) and target_model not in (".", ".."):
        return target_model, target_model
    digest = hashlib.sha256(target_model.encode()).hexdigest()[:12]
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", target_model).lstrip("._-")[:200] or "model"
    return f"{safe}-{digest}", target_model


def folder_name(triton_name: str, folder: str) -> str:
    """The Triton name of an archive's folder other than its entry: ``<Triton name>~<folder>``, unique
    to the archive. A name too long for a directory (NAME_MAX counts bytes) takes a digest of the whole
    name in place of the archive's name, and the folder's name cut to whole characters: the digest keeps
    apart two folders whose names differ only past the cut."""
    name = f"{triton_name}{FOLDER_SEPARATOR}{utf8_folder(folder)}"
    if len(name.encode()) <= NAME_MAX:
        return name
    prefix = hashlib.sha256(name.encode()).hexdigest()[:16] + FOLDER_SEPARATOR
    kept = folder.encode()[: NAME_MAX - len(prefix)].decode(errors="ignore")
    return prefix + kept
