"""Pure parts of the multi-model registry: names, urls, layouts, paging, renames, memory signals."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import orjson
import pytest

from smtriton.serve.dataplane import answers
from smtriton.serve.errors import BadRequest, InsufficientStorage, error_body
from smtriton.serve.host import cgroups
from smtriton.serve.multimodel import layout, memory, names, paging, registry, urls
from smtriton.serve.multimodel.records import ModelRecord
from smtriton.serve.settings import Settings
from smtriton.serve.triton.client import UpstreamResponse


def settings(model_root, **changes) -> Settings:
    """MME settings with no memory reserve and one load at a time."""
    return Settings(model_root=model_root, memory_reserve_bytes=0, max_concurrent_loads=1, **changes)


def test_oom_patterns_match_native_and_whole_word_oom():
    assert memory.is_oom("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert memory.is_oom("MemoryError: Failed to allocate memory for weights")
    assert memory.is_oom("worker hit OOM while loading")
    # NVIDIA's substring match would say yes (docs/contract.md §6 B15).
    assert not memory.is_oom("ZOOM level out of range")


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
    assert memory.out_of_memory("Stub process 'm_0' is not healthy.", 2, group)
    assert not memory.out_of_memory("Stub process 'm_0' is not healthy.", 3, group)
    assert not memory.out_of_memory("Stub process 'm_0' is not healthy.", None, group)  # not counted
    assert memory.out_of_memory("CUDA out of memory", None, None)  # by its words, wherever


@pytest.mark.parametrize("name", ["hashA", "model.tar.gz", "a_b-c.1"])
def test_valid_model_names(name):
    assert names.validate_name(name, "model_name") == name


@pytest.mark.parametrize("name", ["", "..", ".", "a/b", "../x", "-x", "a b", "x\n", 5, None, "a" * 256])
def test_invalid_model_names(name):
    with pytest.raises(BadRequest):
        names.validate_name(name, "model_name")


def test_target_models_with_paths_get_a_safe_triton_name_and_keep_their_shown_name():
    assert names.triton_name_for("h", None) == ("h", "h")
    assert names.triton_name_for("h", "m.tar.gz") == ("m.tar.gz", "m.tar.gz")
    safe, shown = names.triton_name_for("h", "team/resnet.tar.gz")
    assert shown == "team/resnet.tar.gz"
    assert "/" not in safe
    assert safe.startswith("team_resnet.tar.gz-")


def test_rename_in_response_recomputes_the_header_length():
    header = b'{"model_name":"safe-1","model_version":"1","outputs":[]}'
    body, length = answers.rename_in_response(header + b"BIN", len(header), "safe-1", "team/m.tar.gz")
    assert body[:length] == b'{"model_name":"team/m.tar.gz","model_version":"1","outputs":[]}'
    assert body[length:] == b"BIN"


def test_pages_walk_the_list_with_opaque_tokens():
    records = [ModelRecord(f"m{i}", f"/u{i}", None, f"m{i}", [f"m{i}"], f"m{i}") for i in range(5)]
    first = paging.page(records, None, "2")
    assert [m["modelName"] for m in first["models"]] == ["m0", "m1"]
    second = paging.page(records, first["nextPageToken"], "2")
    third = paging.page(records, second["nextPageToken"], "2")
    assert [m["modelName"] for m in third["models"]] == ["m4"]
    assert "nextPageToken" not in third


@pytest.mark.parametrize("token", ["0", "zz", "", "ffff", "3939"])
def test_a_page_token_not_issued_here_lists_from_the_beginning(token, caplog):
    caplog.set_level(logging.INFO, logger="serve.mme")
    records = [ModelRecord(f"m{i}", f"/u{i}", None, f"m{i}", [f"m{i}"], f"m{i}") for i in range(3)]
    assert paging.page(records, token, None) == paging.page(records, None, None)
    assert "was not issued here" in caplog.text


def test_a_url_that_is_a_model_directory_is_listed_as_its_repository(tmp_path):
    root = tmp_path / "models"
    model = root / "abc" / "model"
    model.mkdir(parents=True)
    assert urls.listed_url(model, root) == str(model)
    (model / "config.pbtxt").write_text('name: "m"')
    assert urls.listed_url(model, root) == str(root / "abc")


def test_archive_layouts(tmp_path):
    (tmp_path / "a" / "config.pbtxt").parent.mkdir(parents=True)
    (tmp_path / "a" / "config.pbtxt").write_text('name: "a"')
    assert layout.find_layout(tmp_path, None).entry.name == "a"
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.pbtxt").write_text('name: "b"')
    with pytest.raises(BadRequest, match="ambiguous"):
        layout.find_layout(tmp_path, None)
    assert layout.find_layout(tmp_path, "x/b.tar.gz").entry.name == "b"
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "config.pbtxt").write_text('name: "e"\nplatform:"ensemble"')
    found = layout.find_layout(tmp_path, None)
    assert found.ensemble
    assert found.entry.name == "e"
    assert len(found.others) == 2


def test_an_invoke_is_out_of_memory_only_if_the_oom_killer_struck_during_it(tmp_path):
    group = FakeMemoryCgroup(tmp_path / "cgroup")
    table = registry.ModelRegistry(settings(tmp_path), tmp_path, lambda: None, memory=group)  # type: ignore[arg-type]
    stub_died = "Stub process 'm_0' is not healthy."
    assert not table.invoke_out_of_memory(stub_died, 500, 0)
    group.kills(1)  # a load (or anything) was OOM-killed before this invoke began
    assert not table.invoke_out_of_memory(stub_died, 500, 1)
    assert table.invoke_out_of_memory(stub_died, 500, 0)  # it struck while this one ran
    assert table.invoke_out_of_memory(stub_died, 500, 0)  # and for every invoke that ran meanwhile
    # A failure no killed process explains stays what it is, whatever the OOM killer did meanwhile.
    assert not table.invoke_out_of_memory("unexpected shape for input 'INPUT0'", 400, 0)
    failed = UpstreamResponse(500, "application/json", None, b'{"error":"CUDA out of memory"}')
    verdict = answers.may_be_out_of_memory(failed) and table.invoke_out_of_memory(
        answers.failure_message(failed), 500, 1
    )
    assert answers.to_mme_response(ModelRecord("m", "/u", None, "m", ["m"], "m"), failed, verdict)[0] == 507


def test_the_memory_budget_counts_models_loaded_and_loading(monkeypatch, tmp_path):
    monkeypatch.setattr(cgroups, "available_memory", lambda group: 1 << 40)  # free memory is never the limit
    budgeted = settings(tmp_path, model_memory_budget_bytes=100 << 20)
    table = registry.ModelRegistry(budgeted, tmp_path, lambda: None)  # type: ignore[arg-type]
    table.records["a"] = ModelRecord("a", "/u", None, "a", ["a"], "a", estimate=40 << 20)
    table._pending["b"] = 40 << 20  # a load under way holds its share too
    table._check_memory("c", 20 << 20)  # 40 + 40 + 20 = 100: fits exactly
    with pytest.raises(InsufficientStorage, match="hold 80 MiB of the 100 MiB model memory budget"):
        table._check_memory("c", 21 << 20)
    del table.records["a"]  # an unload gives its share back
    table._check_memory("c", 60 << 20)
    unbudgeted = registry.ModelRegistry(settings(tmp_path), tmp_path, lambda: None)  # type: ignore[arg-type]
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
        work = getattr(registry, name)

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
        monkeypatch.setattr(registry, name, recorded(name))
    root = tmp_path / "models"
    shutil.copytree(Path(__file__).parents[1] / "integration" / "models" / "addsub", root / "a" / "model")
    managed = tmp_path / "managed"
    managed.mkdir()

    async def load_and_unload(port: int) -> None:
        client = TritonClient(f"http://127.0.0.1:{port}", 30)
        table = registry.ModelRegistry(settings(root), managed, lambda: client)
        try:
            await table.load(b'{"model_name": "a", "url": "' + str(root / "a" / "model").encode() + b'"}', None)
            assert "a" in table.records
            await table.unload("a", None)
            assert table.records == {}
        finally:
            await client.close()

    with stand_in_thread() as triton:
        asyncio.run(load_and_unload(triton.port))
    assert where == {name: {"thread"} for name in names}


def test_a_sparse_file_counts_the_bytes_it_holds_not_its_apparent_size(tmp_path):
    """A terabyte that takes kilobytes must not make a load look too large (a 507 evicts other models)."""
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "1" / "weights.bin").write_bytes(b"w" * 10_000)
    with (model / "1" / "huge.bin").open("wb") as sparse:
        sparse.truncate(1 << 40)
    (model / "1" / "link.bin").symlink_to("weights.bin")
    assert 10_000 <= memory.tree_size(model) < 1 << 20


def test_urls_that_loop_are_too_long_or_are_the_root_itself_are_one_line_400s(tmp_path):
    root = tmp_path / "models"
    (root / "a" / "model").mkdir(parents=True)
    (root / "loop").symlink_to("loop")
    (root / "a" / "model" / "x").symlink_to("y")
    (root / "a" / "model" / "y").symlink_to("x")
    cases = {
        str(root / "loop"): "a loop of symlinks",
        str(root / "a" / "model"): "holds a loop of symlinks",
        "/" + "d" * 8000: "longer than 4096 characters",
        str(root / ("d" * 300) / "model"): "a path too long to resolve",
        str(root): "is the model root itself",
        f"{root}/": "is the model root itself",
        str(root / "missing"): "repository not found",
    }
    for url, says in cases.items():
        with pytest.raises(BadRequest) as refused:
            urls.confine_url(url, root)
        message = refused.value.message
        assert says in message, (url[:80], message)
        assert "\n" not in message
        assert len(message) < 400


def test_an_alias_of_a_url_under_the_root_is_listed_by_its_canonical_path(tmp_path):
    root = tmp_path / "models"
    model = root / "abc" / "model"
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "m"')
    for alias in (f"/proc/self/root{model}", f"{root}//abc/./model/", str(model)):
        real = urls.confine_url(alias, root)
        assert urls.listed_url(real, root) == str(root / "abc")


def test_folders_other_than_the_entry_get_names_no_entry_or_other_archive_can_take():
    assert names.folder_name("m.tar.gz", "helper") == "m.tar.gz~helper"
    with pytest.raises(BadRequest):
        names.validate_name("m.tar.gz~helper", "model_name")  # no load can be named like a folder
    long = names.folder_name("x" * 250, "helper")
    assert len(long) <= 255
    assert long.endswith("~helper")
    assert long != names.folder_name("y" * 250, "helper")


def test_a_long_folder_name_fits_a_directory_in_bytes_and_stays_apart_from_its_neighbours(tmp_path):
    """NAME_MAX counts bytes: a name of two-byte characters is cut to whole characters that fit; and two
    folders whose names differ only past the cut keep names of their own."""
    wide = names.folder_name("m", "é" * 127)  # 2 + 254 bytes: one too many
    assert len(wide.encode()) <= names.NAME_MAX
    assert wide.endswith("é" * 100)
    (tmp_path / wide).mkdir()  # no ENAMETOOLONG
    first, second = (names.folder_name("t" * 30, "a" * 240 + last) for last in "xy")
    assert first != second
    assert len(first.encode()) <= names.NAME_MAX
    assert names.FOLDER_SEPARATOR in first


def test_a_python_model_of_a_multi_folder_archive_calls_the_folders_by_their_names(tmp_path):
    """Staged with an __init__.py of ours in each version folder (then the model's own, if it had one):
    a BLS request naming a folder goes to that folder's model; the files are the archive's own."""
    from smtriton.serve.multimodel.staging import stage_model

    source = tmp_path / "archive" / "entry"
    (source / "1").mkdir(parents=True)
    (source / "config.pbtxt").write_text('name: "entry"\nbackend: "python"\n')
    (source / "1" / "model.py").write_text("class TritonPythonModel: pass\n")
    (source / "1" / "__init__.py").write_text("THEIRS = True\n")
    managed = tmp_path / "managed"
    managed.mkdir()
    renames = {"entry": "m.tar.gz", "helper": "m.tar.gz~helper"}
    staged = stage_model(source, "m.tar.gz", renames, managed)
    assert staged == managed / "m.tar.gz"
    assert 'name: "m.tar.gz"' in (staged / "config.pbtxt").read_text()
    version = staged / "1"
    assert version.is_dir()
    assert not version.is_symlink()
    assert (version / "model.py").resolve() == (source / "1" / "model.py").resolve()
    init = (version / "__init__.py").read_text()
    assert "'helper': 'm.tar.gz~helper'" in init
    assert str((source / "1" / "__init__.py").resolve()) in init  # theirs still runs, after ours
    single = stage_model(source, "solo", {}, managed)  # one model alone: nothing to re-point
    assert (single / "1").is_symlink()


def test_a_bls_request_naming_a_folder_is_sent_to_its_model(tmp_path):
    """The __init__.py of ours, run against a stand-in of the Python backend's request class."""
    import subprocess
    import sys

    from smtriton.serve.multimodel.staging import BLS_NAMES

    fake = tmp_path / "c_python_backend_utils.py"
    fake.write_text(
        "class InferenceRequest:\n"
        "    def __init__(self, model_name='', inputs=(), **kwargs):\n"
        "        self.model_name = model_name\n"
    )
    shim = tmp_path / "shim.py"
    shim.write_text(BLS_NAMES.format(names={"helper": "m~helper"}))
    code = (
        "import shim, c_python_backend_utils as c\n"
        "print(c.InferenceRequest(model_name='helper').model_name, c.InferenceRequest('helper').model_name,"
        " c.InferenceRequest('other').model_name, c.InferenceRequest.__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=30)
    assert done.stdout.split() == ["m~helper", "m~helper", "other", "InferenceRequest"], done.stderr


def test_tritons_words_name_files_inside_the_archive_and_models_as_the_caller_knows_them():
    record = ModelRecord(
        "f776c6", "/u", "bad tag.tar.gz", "bad_tag.tar.gz-0a1b", ["bad_tag.tar.gz-0a1b"], "bad tag.tar.gz"
    )
    record.folders = {"bad_tag.tar.gz-0a1b~helper": "helper", "bad_tag.tar.gz-0a1b": "badtag"}
    record.staged_root, record.source_root = "/tmp/smtriton-x/managed", "/opt/ml/models/f776c6/model"
    text = (
        "model instance 'bad_tag.tar.gz-0a1b_0_0': at /tmp/smtriton-x/managed/bad_tag.tar.gz-0a1b/1/model.py(15); "
        "'bad_tag.tar.gz-0a1b~helper' at /tmp/smtriton-x/managed/bad_tag.tar.gz-0a1b~helper/1/model.onnx, "
        "/opt/ml/models/f776c6/model/helper/1/x"
    )
    assert record.in_callers_terms(text) == (
        "model instance 'bad tag.tar.gz': at badtag/1/model.py(15); 'helper' at helper/1/model.onnx, helper/1/x"
    )


MODELS = Path(__file__).parents[1] / "integration" / "models"
NOT_UTF8 = os.fsdecode(b"m\xff")  # a folder named b"m\xff", as os gives its name: "m\udcff"


def _archive_with(url: Path, kind: str) -> None:
    """An extracted archive (as SageMaker extracts one, bytes as they are) with a model folder named
    b"m\\xff": alone, as an ensemble's step, or beside another model."""
    shutil.copytree(MODELS / "addsub", url / NOT_UTF8)
    if kind == "ensemble":
        shutil.copytree(MODELS.parent / "models_mme" / "ens", url / "ens")
    elif kind == "ambiguous":
        shutil.copytree(MODELS / "addsub", url / "other")


@pytest.mark.parametrize("kind", ["alone", "ensemble", "ambiguous"])
def test_a_model_folder_whose_name_is_not_utf8_is_a_400_naming_it_and_the_name_loads_after(tmp_path, kind):
    """Refused in one line, its byte escaped, before anything is staged; the same name then loads. Once:
    a UnicodeEncodeError (folder_name), a record no worker could be told of, or a refusal that could
    not cross to the worker (the client waited for ever)."""
    import asyncio

    from smtriton.serve.triton.client import TritonClient
    from tests.unit.triton_stand_in import stand_in_thread

    root = tmp_path / "models"
    _archive_with(root / "bad" / "model", kind)
    shutil.copytree(MODELS / "addsub", root / "good" / "model")
    managed = tmp_path / "managed"
    managed.mkdir()

    async def load_twice(port: int) -> None:
        client = TritonClient(f"http://127.0.0.1:{port}", 30)
        table = registry.ModelRegistry(settings(root), managed, lambda: client)
        try:
            with pytest.raises(BadRequest) as refused:
                await table.load(orjson.dumps({"model_name": "a", "url": str(root / "bad" / "model")}), None)
            message = refused.value.message
            assert refused.value.status == 400
            assert message == (
                "model folder 'm\\xff' of the archive has a name that is not UTF-8: rename it and package the "
                "archive again"
            )
            assert orjson.loads(error_body(message)) == {"error": message}
            assert (table.records, table._loading, list(managed.iterdir())) == ({}, set(), [])
            await table.load(orjson.dumps({"model_name": "a", "url": str(root / "good" / "model")}), "x.tar.gz")
            assert list(table.records) == ["a"]
        finally:
            await client.close()

    with stand_in_thread() as triton:
        asyncio.run(load_twice(triton.port))


def test_a_folder_name_that_is_not_utf8_never_becomes_a_triton_name():
    with pytest.raises(BadRequest, match=r"model folder 'h\\xff' of the archive has a name that is not UTF-8"):
        names.folder_name("m.tar.gz", os.fsdecode(b"h\xff"))


def test_a_url_that_resolves_to_a_path_that_is_not_utf8_or_holds_such_a_link_out_is_a_400_naming_it(tmp_path):
    """Its record, and the model list, show where it lies: a path that is not UTF-8 could not be shown."""
    root = tmp_path / "models"
    (root / NOT_UTF8 / "model").mkdir(parents=True)
    (root / "alias").symlink_to(NOT_UTF8)
    with pytest.raises(BadRequest) as refused:
        urls.confine_url(str(root / "alias" / "model"), root)
    assert refused.value.message == (
        f"url '{root}/alias/model' resolves to a path that is not UTF-8: '{root}/m\\xff/model'"
    )
    (root / "a" / "model").mkdir(parents=True)
    (root / "a" / "model" / os.fsdecode(b"l\xfe")).symlink_to(tmp_path)
    with pytest.raises(BadRequest) as refused:
        urls.confine_url(str(root / "a" / "model"), root)
    assert refused.value.message.endswith("holds a symlink that leads outside it: l\\xfe")
