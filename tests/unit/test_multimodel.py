"""Pure parts of the multi-model registry: names, urls, layouts, paging, renames, memory signals."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from smtriton.serve.dataplane import answers as edge
from smtriton.serve.errors import BadRequest, InsufficientStorage
from smtriton.serve.host import cgroups
from smtriton.serve.multimodel import registry as multimodel
from smtriton.serve.records import ModelRecord
from smtriton.serve.settings import Settings
from smtriton.serve.triton.client import UpstreamResponse


def settings(model_root, **changes) -> Settings:
    """MME settings with no memory reserve and one load at a time."""
    return Settings(model_root=model_root, memory_reserve_bytes=0, max_concurrent_loads=1, **changes)


def test_oom_patterns_match_native_and_whole_word_oom():
    assert multimodel.is_oom("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert multimodel.is_oom("MemoryError: Failed to allocate memory for weights")
    assert multimodel.is_oom("worker hit OOM while loading")
    # NVIDIA's substring match would say yes (docs/contract.md §6 B15).
    assert not multimodel.is_oom("ZOOM level out of range")


class FakeMemoryCgroup(cgroups.MemoryGroup):
    """A cgroup v2 directory of the test's own: its OOM killer's count is what the test writes."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        super().__init__(directory, 2)
        self.kills(0)

    def kills(self, count: int) -> None:
        (self.directory / "memory.events").write_text(f"low 0\nhigh 0\nmax 0\noom 0\noom_kill {count}\n")


def test_a_stub_killed_by_the_oom_killer_counts_as_oom(tmp_path):
    group = FakeMemoryCgroup(tmp_path / "cgroup")
    group.kills(3)
    assert multimodel.out_of_memory("Stub process 'm_0' is not healthy.", 2, group)
    assert not multimodel.out_of_memory("Stub process 'm_0' is not healthy.", 3, group)
    assert not multimodel.out_of_memory("Stub process 'm_0' is not healthy.", None, group)  # not counted
    assert multimodel.out_of_memory("CUDA out of memory", None, None)  # by its words, wherever


@pytest.mark.parametrize("name", ["hashA", "model.tar.gz", "a_b-c.1"])
def test_valid_model_names(name):
    assert multimodel.validate_name(name, "model_name") == name


@pytest.mark.parametrize("name", ["", "..", ".", "a/b", "../x", "-x", "a b", "x\n", 5, None, "a" * 256])
def test_invalid_model_names(name):
    with pytest.raises(BadRequest):
        multimodel.validate_name(name, "model_name")


def test_target_models_with_paths_get_a_safe_triton_name_and_keep_their_shown_name():
    assert multimodel.triton_name_for("h", None) == ("h", "h")
    assert multimodel.triton_name_for("h", "m.tar.gz") == ("m.tar.gz", "m.tar.gz")
    safe, shown = multimodel.triton_name_for("h", "team/resnet.tar.gz")
    assert shown == "team/resnet.tar.gz"
    assert "/" not in safe
    assert safe.startswith("team_resnet.tar.gz-")


def test_rename_in_response_recomputes_the_header_length():
    header = b'{"model_name":"safe-1","model_version":"1","outputs":[]}'
    body, length = edge.rename_in_response(header + b"BIN", len(header), "safe-1", "team/m.tar.gz")
    assert body[:length] == b'{"model_name":"team/m.tar.gz","model_version":"1","outputs":[]}'
    assert body[length:] == b"BIN"


def test_pages_walk_the_list_with_opaque_tokens():
    records = [ModelRecord(f"m{i}", f"/u{i}", None, f"m{i}", [f"m{i}"], f"m{i}") for i in range(5)]
    first = multimodel.page(records, None, "2")
    assert [m["modelName"] for m in first["models"]] == ["m0", "m1"]
    second = multimodel.page(records, first["nextPageToken"], "2")
    third = multimodel.page(records, second["nextPageToken"], "2")
    assert [m["modelName"] for m in third["models"]] == ["m4"]
    assert "nextPageToken" not in third


@pytest.mark.parametrize("token", ["0", "zz", "", "ffff", "3939"])
def test_a_page_token_not_issued_here_lists_from_the_beginning(token, caplog):
    caplog.set_level(logging.INFO, logger="serve.mme")
    records = [ModelRecord(f"m{i}", f"/u{i}", None, f"m{i}", [f"m{i}"], f"m{i}") for i in range(3)]
    assert multimodel.page(records, token, None) == multimodel.page(records, None, None)
    assert "was not issued here" in caplog.text


def test_a_url_that_is_a_model_directory_is_listed_as_its_repository(tmp_path):
    model = tmp_path / "abc" / "model"
    model.mkdir(parents=True)
    assert multimodel.listed_url("/opt/ml/models/abc/model", model) == "/opt/ml/models/abc/model"
    (model / "config.pbtxt").write_text('name: "m"')
    assert multimodel.listed_url("/opt/ml/models/abc/model", model) == "/opt/ml/models/abc"
    assert multimodel.listed_url("/opt/ml/models/abc/model/", model) == "/opt/ml/models/abc"


def test_archive_layouts(tmp_path):
    (tmp_path / "a" / "config.pbtxt").parent.mkdir(parents=True)
    (tmp_path / "a" / "config.pbtxt").write_text('name: "a"')
    assert multimodel.find_layout(tmp_path, None).entry.name == "a"
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.pbtxt").write_text('name: "b"')
    with pytest.raises(BadRequest, match="ambiguous"):
        multimodel.find_layout(tmp_path, None)
    assert multimodel.find_layout(tmp_path, "x/b.tar.gz").entry.name == "b"
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "config.pbtxt").write_text('name: "e"\nplatform:"ensemble"')
    layout = multimodel.find_layout(tmp_path, None)
    assert layout.ensemble
    assert layout.entry.name == "e"
    assert len(layout.others) == 2


def test_an_invoke_is_out_of_memory_only_if_the_oom_killer_struck_during_it(tmp_path):
    group = FakeMemoryCgroup(tmp_path / "cgroup")
    registry = multimodel.ModelRegistry(settings(tmp_path), tmp_path, lambda: None, memory=group)  # type: ignore[arg-type]
    stub_died = "Stub process 'm_0' is not healthy."
    assert not registry.invoke_out_of_memory(stub_died, 500, 0)
    group.kills(1)  # a load (or anything) was OOM-killed before this invoke began
    assert not registry.invoke_out_of_memory(stub_died, 500, 1)
    assert registry.invoke_out_of_memory(stub_died, 500, 0)  # it struck while this one ran
    assert registry.invoke_out_of_memory(stub_died, 500, 0)  # and for every invoke that ran meanwhile
    # A failure no killed process explains stays what it is, whatever the OOM killer did meanwhile.
    assert not registry.invoke_out_of_memory("unexpected shape for input 'INPUT0'", 400, 0)
    failed = UpstreamResponse(500, "application/json", None, b'{"error":"CUDA out of memory"}')
    verdict = edge.may_be_out_of_memory(failed) and registry.invoke_out_of_memory(edge.failure_message(failed), 500, 1)
    assert edge.to_mme_response(ModelRecord("m", "/u", None, "m", ["m"], "m"), failed, verdict)[0] == 507


def test_the_memory_budget_counts_models_loaded_and_loading(monkeypatch, tmp_path):
    monkeypatch.setattr(cgroups, "available_memory", lambda group: 1 << 40)  # free memory is never the limit
    budgeted = settings(tmp_path, model_memory_budget_bytes=100 << 20)
    registry = multimodel.ModelRegistry(budgeted, tmp_path, lambda: None)  # type: ignore[arg-type]
    registry.records["a"] = ModelRecord("a", "/u", None, "a", ["a"], "a", estimate=40 << 20)
    registry._pending["b"] = 40 << 20  # a load under way holds its share too
    registry._check_memory("c", 20 << 20)  # 40 + 40 + 20 = 100: fits exactly
    with pytest.raises(InsufficientStorage, match="hold 80 MiB of the 100 MiB model memory budget"):
        registry._check_memory("c", 21 << 20)
    del registry.records["a"]  # an unload gives its share back
    registry._check_memory("c", 60 << 20)
    unbudgeted = multimodel.ModelRegistry(settings(tmp_path), tmp_path, lambda: None)  # type: ignore[arg-type]
    unbudgeted._check_memory("c", 1 << 39)
    with pytest.raises(InsufficientStorage, match="available"):
        unbudgeted._check_memory("c", 1 << 41)


def test_the_target_model_header_names_a_model_by_one_rule_however_it_was_loaded():
    with_header = ModelRecord("abc", "/u", "model.tar.gz", "model.tar.gz", ["model.tar.gz"], "abc")
    with_header.check_target(None)
    with_header.check_target("model.tar.gz")
    with pytest.raises(BadRequest, match="does not match"):
        with_header.check_target("abc")
    without_header = ModelRecord("abc", "/u", None, "abc", ["abc"], "abc")
    without_header.check_target(None)
    without_header.check_target("abc")  # the model's own name, as the URL names it
    with pytest.raises(BadRequest, match="does not match"):
        without_header.check_target("other")


def test_a_load_and_an_unload_do_their_file_work_off_the_event_loop(monkeypatch, tmp_path):
    """Finding, measuring, staging and removing a model's files runs in threads: a large archive never
    holds up the requests the event loop is serving meanwhile. Checked against the Triton stand-in."""
    import asyncio
    import shutil

    from smtriton.serve.triton.client import TritonClient
    from tests.unit.triton_stand_in import stand_in_thread

    where: dict[str, set[str]] = {}

    def recorded(name: str):
        work = getattr(multimodel, name)

        def run(*args, **kwargs):
            try:
                asyncio.get_running_loop()
                place = "event loop"
            except RuntimeError:
                place = "thread"
            where.setdefault(name, set()).add(place)
            return work(*args, **kwargs)

        return run

    names = ("confine_url", "find_layout", "check_models", "tree_size", "stage_model", "listed_url", "remove_staged")
    for name in names:
        monkeypatch.setattr(multimodel, name, recorded(name))
    root = tmp_path / "models"
    shutil.copytree(Path(__file__).parents[1] / "integration" / "models" / "addsub", root / "a" / "model")
    managed = tmp_path / "managed"
    managed.mkdir()

    async def load_and_unload(port: int) -> None:
        client = TritonClient(f"http://127.0.0.1:{port}", 30)
        registry = multimodel.ModelRegistry(settings(root), managed, lambda: client)
        try:
            await registry.load(b'{"model_name": "a", "url": "' + str(root / "a" / "model").encode() + b'"}', None)
            assert "a" in registry.records
            await registry.unload("a", None)
            assert registry.records == {}
        finally:
            await client.close()

    with stand_in_thread() as triton:
        asyncio.run(load_and_unload(triton.port))
    assert where == {name: {"thread"} for name in names}
