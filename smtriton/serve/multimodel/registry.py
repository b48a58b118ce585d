"""Multi-model endpoint registry: load, list, describe, unload, invoke (docs/contract.md §2.4, §4).

Triton's public API can load and unload but not register another repository or rename a model, so
`serve` owns one *managed repository* that Triton serves in explicit mode. Loading an archive confines
its url (:mod:`.urls`), finds its layout (:mod:`.layout`), checks what it will cost (:mod:`.memory`)
and stages each of its model directories there under its Triton name (:mod:`.staging`, :mod:`.names`).
Every later request resolves through the load record, never through a header
(docs/contract.md §6 B7). Loads and unloads of one ``model_name`` never interleave (§6 B6): a load of
a name that is loaded, loading or unloading is refused (409) before anything awaits, and unloads of one
name take its lock in turn, so the second finds nothing (404).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from smtriton.serve.errors import (
    BadRequest,
    Conflict,
    InsufficientStorage,
    InternalError,
    ModelLoadFailed,
    ModelNotFound,
    NotReady,
    ServeError,
)
from smtriton.serve.host import cgroups
from smtriton.serve.host.gpu import gpu_free_memory
from smtriton.serve.multimodel.layout import find_layout
from smtriton.serve.multimodel.memory import KILLABLE_STATUS, out_of_memory, tree_size
from smtriton.serve.multimodel.names import folder_name, parse_load_body, triton_name_for
from smtriton.serve.multimodel.paging import page
from smtriton.serve.multimodel.records import ModelRecord
from smtriton.serve.multimodel.staging import load_failure, remove_staged, stage_model
from smtriton.serve.multimodel.urls import confine_url, listed_url
from smtriton.serve.settings import Settings
from smtriton.serve.triton import shm
from smtriton.serve.triton.client import TritonClient
from smtriton.serve.triton.tensorrt_check import check_models

log = logging.getLogger("serve.mme")


class RegistryListener(Protocol):
    """Who must see a change of the table before it is answered: the front workers, which invoke models
    through their own copy of the records and count the invokes they run."""

    async def added(self, record: ModelRecord) -> None: ...

    async def draining_model(self, record: ModelRecord, timeout: float) -> None:
        """Stop taking invokes of the model and wait (up to ``timeout`` s) for those running to finish."""

    async def removed(self, record: ModelRecord) -> None: ...


@dataclass
class _NameLock:
    """One model name's lock, and how many hold it or wait for it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class ModelRegistry:
    """The MME model table and every operation on it; one per endpoint, in `serve`'s main process."""

    def __init__(
        self,
        settings: Settings,
        managed: Path,
        client: Callable[[], TritonClient],
        *,
        unload_drain_s: float = 60.0,
        unload_timeout_s: float = 240.0,
        memory: cgroups.MemoryGroup | None = None,
        native_backends: set[str] | None = None,
    ) -> None:
        """``managed`` is the repository Triton serves; ``client`` gives the Triton client while it runs."""
        self._budget = settings.model_memory_budget_bytes
        self._pending: dict[str, int] = {}  # estimates of loads past the memory check, not yet recorded
        self._gpu_reserve = settings.gpu_memory_reserve_bytes
        self._memory = memory if memory is not None else cgroups.memory_group()
        self._native = native_backends or set()  # backends the Triton binary has (the rest run on Python's)
        self._shm_region = settings.triton.shm_default_byte_size
        self.model_root = settings.model_root
        self.managed = managed
        self._client = client
        self._reserve = settings.memory_reserve_bytes
        self._factor = settings.model_memory_factor
        self._load_slots = asyncio.Semaphore(settings.max_concurrent_loads)
        self._drain_s = unload_drain_s
        self._unload_timeout_s = unload_timeout_s
        self._load_timeout_s = settings.startup_timeout_s
        self.records: dict[str, ModelRecord] = {}
        self._loading: set[str] = set()
        self._announcing: dict[str, ModelRecord] = {}  # loaded in Triton, the workers being told
        self._unloading: set[str] = set()
        self._locks: dict[str, _NameLock] = {}
        self.listener: RegistryListener | None = None

    @contextlib.asynccontextmanager
    async def _exclusive(self, name: str) -> AsyncIterator[None]:
        """Hold ``name``'s lock; the lock is forgotten once nobody holds or waits for it, so the table
        of locks stays as small as the names in use."""
        entry = self._locks.setdefault(name, _NameLock())
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._locks[name]

    # ----- queries ------------------------------------------------------------------------------
    def list(self, token: str | None, limit: str | None) -> dict[str, object]:
        return page(sorted(self.records.values(), key=lambda r: r.loaded_at), token, limit)

    def describe(self, name: str) -> dict[str, str]:
        record = self.records.get(name)
        if record is None:
            raise ModelNotFound(name)
        return record.describe()

    # ----- load ---------------------------------------------------------------------------------
    async def load(self, body: bytes, target_model: str | None) -> None:
        name, url = parse_load_body(body)
        if name in self.records or name in self._loading or name in self._unloading:
            raise Conflict(f"model '{name}' is already loaded")
        self._loading.add(name)  # before any await: a concurrent load of the same name gets 409
        try:
            async with self._load_slots:
                record = await self._load(name, url, target_model)
            await self._announce(record)
            self.records[name] = record
        finally:
            self._loading.discard(name)
            self._pending.pop(name, None)
        log.info("loaded model %s (Triton %s) from %s", name, record.triton_name, url)

    async def _announce(self, record: ModelRecord) -> None:
        """Tell the workers of a model Triton loaded. Meanwhile it counts as loaded for a restore (a
        Triton that restarts now loads it too); if it cannot be told, or the restore could not load it
        again, the load fails and leaves nothing behind, in the workers told of it neither."""
        self._announcing[record.model_name] = record
        try:
            if self.listener is not None:
                await self.listener.added(record)
        except BaseException:
            self._announcing.pop(record.model_name, None)
            await self._withdraw(record)
            raise
        if self._announcing.pop(record.model_name, None) is None:  # dropped by a restore that failed it
            await self._withdraw(record)
            raise ModelLoadFailed(f"model '{record.model_name}' failed to load again when Triton restarted")

    async def _withdraw(self, record: ModelRecord) -> None:
        """A load failed while it was announced: the workers that recorded the model forget it, then
        what the load staged is removed. A worker that cannot be told is logged, not the load's error."""
        try:
            if self.listener is not None:
                await self.listener.removed(record)
        except Exception:
            log.exception("model %s could not be withdrawn from every worker", record.model_name)
        finally:
            await self._discard(record.triton_names)

    async def _load(self, name: str, url: str, target_model: str | None) -> ModelRecord:
        real = await asyncio.to_thread(confine_url, url, self.model_root)
        layout = await asyncio.to_thread(find_layout, real, target_model)
        triton_name, shown = triton_name_for(name, target_model)
        if any(r.triton_name == triton_name for r in self.records.values()):
            raise Conflict(f"failed to register '{triton_name}', there is a conflicting mapping for '{triton_name}'")
        problems = await asyncio.to_thread(check_models, [layout.entry, *layout.others])
        if problems:  # a plan built for another TensorRT or GPU: say so rather than let Triton fail it
            raise BadRequest(f"model '{name}' cannot be loaded on this host: " + "; ".join(problems))
        needed = int(await asyncio.to_thread(tree_size, real) * self._factor)
        self._check_memory(name, needed)
        self._pending[name] = needed  # counted against the budget until the load ends
        gpus = await asyncio.to_thread(gpu_free_memory)
        if gpus and max(gpus) < self._gpu_reserve:
            raise InsufficientStorage(
                f"not enough GPU memory to load model '{name}': the most free on any GPU is {max(gpus) >> 20} MiB, "
                f"below the reserve of {self._gpu_reserve >> 20} MiB"
            )
        dirs = [layout.entry, *layout.others]
        problem = await asyncio.to_thread(shm.shortfall, dirs, self._shm_region, self._native, len(gpus))
        if problem is not None:
            raise InsufficientStorage(f"cannot load model '{name}': {problem}")
        renames = {d.name: folder_name(triton_name, d.name) for d in layout.others}
        if renames:  # a BLS call or an ensemble step may name the entry's folder too
            renames[layout.entry.name] = triton_name
        staged: list[str] = []
        folders: dict[str, str] = {}  # staged name -> its folder inside the archive
        try:
            for source, staged_name in (
                *((other, renames[other.name]) for other in layout.others),
                (layout.entry, triton_name),
            ):
                stage = await asyncio.to_thread(stage_model, source, staged_name, renames, self.managed)
                staged.append(stage.name)
                folders[stage.name] = "" if source == real else source.relative_to(real).as_posix()
            listed = await asyncio.to_thread(listed_url, real, self.model_root)
            record = ModelRecord(name, listed, target_model, triton_name, staged, shown, estimate=needed)
            record.folders, record.staged_root, record.source_root = folders, str(self.managed), str(real)
            client = self._client()
            await self._load_in_triton(record, client)
            record.decoupled = await client.is_decoupled(triton_name)
            if self._client() is not client:  # the Triton that loaded it is gone, and so is the model
                raise NotReady(f"Triton restarted while model '{name}' was loading: load it again")
        except BaseException:
            await self._discard(staged)
            raise
        return record

    async def _discard(self, triton_names: Sequence[str]) -> None:
        """Remove what a failed load staged: unloaded from Triton where one runs (a Triton that died
        took the models with it, and a new one never loaded them), then the staged directories, always."""
        try:
            await self._unload_in_triton(triton_names, wait=False)
        except ServeError as exc:
            log.info("Triton did not unload %s (%s); removing the staged models", ", ".join(triton_names), exc.message)
        finally:
            await asyncio.to_thread(remove_staged, self.managed, triton_names)

    def _check_memory(self, name: str, needed: int) -> None:
        """507 when the load would leave less free host memory than the reserve, or (with a budget) when
        the estimates of the models loaded and loading would pass it. Free memory alone cannot see the
        loads still under way, nor a model that allocates lazily on its first request."""
        free = cgroups.available_memory(self._memory)
        if free is not None and needed + self._reserve > free:
            raise InsufficientStorage(
                f"not enough memory to load model '{name}': it needs about {needed >> 20} MiB plus a reserve of "
                f"{self._reserve >> 20} MiB, and {free >> 20} MiB are available"
            )
        if self._budget is not None:
            held = sum(r.estimate for r in self.records.values()) + sum(self._pending.values())
            if held + needed > self._budget:
                raise InsufficientStorage(
                    f"not enough memory to load model '{name}': it needs about {needed >> 20} MiB, and the models "
                    f"loaded or loading hold {held >> 20} MiB of the {self._budget >> 20} MiB model memory budget"
                )

    async def _load_in_triton(self, record: ModelRecord, client: TritonClient) -> None:
        """Members first (BLS targets must exist), the entry last; failures mapped 507/400, worded for the
        caller (:func:`load_failure`), Triton's whole message in the log."""
        kills = self._memory.oom_kills() if self._memory is not None else None
        for triton_name in record.triton_names:
            try:
                await client.load_model(triton_name, self._load_timeout_s)
            except ModelLoadFailed as exc:
                log.warning("model %s did not load in Triton: %s", record.model_name, exc.message)
                message = load_failure(record.response_name, exc.message, record)
                if out_of_memory(exc.message, kills, self._memory):
                    raise InsufficientStorage(message) from None
                raise ModelLoadFailed(message) from None

    # ----- unload -------------------------------------------------------------------------------
    async def unload(self, name: str, target_model: str | None) -> None:
        if name not in self.records:
            raise ModelNotFound(name)
        async with self._exclusive(name):
            record = self.records.get(name)
            if record is None:  # a concurrent unload finished first
                raise ModelNotFound(name)
            record.check_target(target_model)
            await self._unload(record)
        await asyncio.to_thread(remove_staged, self.managed, record.triton_names)
        log.info("unloaded model %s", name)

    async def _unload(self, record: ModelRecord) -> None:
        """Invokes already running finish and new ones get 404 from here on; then Triton unloads the
        model. If Triton cannot, the model stays loaded and invokes may reach it again."""
        name = record.model_name
        self._unloading.add(name)
        try:
            if self.listener is not None:
                await self.listener.draining_model(record, self._drain_s)
            try:
                await self._unload_in_triton(list(reversed(record.triton_names)), wait=True)
            except BaseException:
                if self.listener is not None:
                    await self.listener.added(record)
                raise
            del self.records[name]
        finally:
            self._unloading.discard(name)

    async def _unload_in_triton(self, triton_names: Sequence[str], wait: bool) -> None:
        client = self._client()
        for triton_name in triton_names:
            try:
                await client.unload_model(triton_name, unload_dependents=False)
            except ServeError:
                if wait:
                    raise
        if not wait:
            return
        deadline = time.monotonic() + self._unload_timeout_s
        pending = set(triton_names)
        while pending:
            states = await client.model_states()
            pending = {n for n in pending if states.get(n) in ("READY", "LOADING", "UNLOADING")}
            if not pending:
                return
            if time.monotonic() > deadline:
                raise InternalError(f"unloading {', '.join(sorted(pending))} did not finish in time")
            await asyncio.sleep(0.1)

    # ----- invoke -------------------------------------------------------------------------------
    def invoke_out_of_memory(self, message: str, status: int, kills_before: int | None) -> bool:
        """Whether a failed invoke was out of memory: by its message, or, for a failure a killed process
        explains, because the OOM killer struck in this cgroup since the invoke began
        (``kills_before``)."""
        return out_of_memory(message, kills_before if status >= KILLABLE_STATUS else None, self._memory)

    # ----- Triton restarted ---------------------------------------------------------------------
    async def restore(self) -> None:
        """Re-load every recorded model after a Triton restart, oldest first (with the models whose load
        is being announced). A model Triton refuses is dropped; a Triton that goes away meanwhile ends the
        restore (raised: the supervisor starts it again and the records stay for the next restore)."""
        client = self._client()
        for record in sorted([*self.records.values(), *self._announcing.values()], key=lambda r: r.loaded_at):
            try:
                await self._load_in_triton(record, client)
            except NotReady:
                raise
            except ServeError as exc:
                log.error("model %s could not be restored and is dropped: %s", record.model_name, exc.message)
                if self._announcing.pop(record.model_name, None) is not None:
                    continue  # its load fails, and cleans up after itself
                self.records.pop(record.model_name, None)
                if self.listener is not None:
                    await self.listener.removed(record)
                await asyncio.to_thread(remove_staged, self.managed, record.triton_names)
            else:
                log.info("restored model %s", record.model_name)
