"""The package's structure: no import circle anywhere in ``smtriton``, deferred imports (inside functions)
included; ``smtriton``'s own top-level packages (and modules) import each other one way;
``smtriton/serve``'s rooms (its subpackages, and each module at its top) import each other one way; and so
do the rooms of the data plane (``serve/dataplane/``: reading, batching, records, sending, and the call
and its reply at its top), each of whose modules holds one job: the tree reads top-down as
docs/design.md §4 draws it.

Imports under ``if TYPE_CHECKING:`` are left out: they name types for the checker and never run.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "smtriton"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py") if "pybackends" not in p.parts}


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in (child, *_runtime_nodes(child)))
            continue
        yield node
        yield from _runtime_nodes(node)


def _imports(name: str, path: Path) -> set[str]:
    """The modules of ``smtriton`` that module ``name`` imports, at any depth."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in MODULES and t != name)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_module_of_smtriton_imports_itself_back_through_others():
    assert _cycles(GRAPH) == []


def _top_level(module: str) -> str | None:
    """The top-level package (or module) of ``smtriton`` a module is in: ``smtriton.convert.cli`` -> convert."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _grouped(graph: dict[str, set[str]], group: Callable[[str], str | None]) -> dict[str, set[str]]:
    """The import graph between groups of modules: one group imports another when any of its modules does."""
    groups: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = group(module)
        if source is None:
            continue
        groups.setdefault(source, set()).update(
            target for t in targets if (target := group(t)) is not None and target != source
        )
    return groups


def test_the_top_level_packages_of_smtriton_import_each_other_one_way():
    """convert writes repositories and validates them (it imports repo); repo reads artifacts without
    convert. A tie both ways between two packages would make each a part of the other."""
    packages = _grouped(GRAPH, _top_level)
    assert _cycles(packages) == []
    assert {"aws", "convert", "repo", "serve", "local", "perf", "tune", "demo"} <= set(packages)


def test_a_tie_between_two_top_level_packages_is_seen_through_their_modules():
    tie = {
        "smtriton.convert.cli": {"smtriton.repo.validate"},
        "smtriton.repo.validate": {"smtriton.convert.artifacts"},
        "smtriton.convert.artifacts": set(),
        "smtriton.dtypes": set(),
    }
    assert _cycles(tie) == []  # no module imports itself back
    assert _cycles(_grouped(tie, _top_level)) == [["convert", "repo"]]


def _room(module: str) -> str | None:
    """The room of ``smtriton/serve`` a module is in: its subpackage, or the module itself at the top."""
    parts = module.split(".")
    if parts[:2] != ["smtriton", "serve"] or len(parts) < 3:
        return None
    return parts[2]


def test_the_rooms_of_serve_import_each_other_one_way():
    rooms = _grouped(GRAPH, _room)
    assert _cycles(rooms) == []
    assert {"host", "ipc", "triton", "multimodel", "dataplane", "http", "owner"} <= set(rooms)


def test_the_checks_see_a_circle_when_there_is_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\ndef f():\n    import y\n"
    names = {n.names[0].name for n in _runtime_nodes(ast.parse(source)) if isinstance(n, ast.Import)}
    assert names == {"y"}  # a deferred import counts, a type-checking one does not


def test_the_http_side_takes_only_the_data_planes_one_call_and_its_types():
    """Each route makes one call into the data plane (docs/design.md §4): http/ imports the plane and
    the request and reply it takes and gives, nothing else of the data plane's parts."""
    reached = {
        target
        for module, targets in GRAPH.items()
        if module.startswith("smtriton.serve.http.")
        for target in targets
        if target.startswith("smtriton.serve.dataplane")
    }
    assert reached == {"smtriton.serve.dataplane.plane", "smtriton.serve.dataplane.request"}


def _dataplane_room(module: str) -> str | None:
    """The room of ``smtriton/serve/dataplane`` a module is in: its subpackage (``reading``, ``batching``,
    ...), or the module itself at the top (``plane``, ``request``, ``answers``)."""
    parts = module.split(".")
    if parts[:3] != ["smtriton", "serve", "dataplane"] or len(parts) < 4:
        return None
    return parts[3]


# The data plane's rooms as a request lives, bottom-up (docs/design.md §4): each imports only rooms
# before it. What the call takes and gives; a body read into an inference; Triton's answer made
# SageMaker's; requests of one model merged; bodies of several records; the way to Triton and to the
# owner; the call itself, the story of one request.
DATAPLANE_ROOMS = ["request", "reading", "answers", "batching", "records", "sending", "plane"]


def test_the_rooms_of_the_data_plane_import_each_other_one_way():
    """A room that imported a room above it would make each a part of the other; one way, "where does a
    request get merged?" is answered in batching/ alone, "what happens when Triton is down?" in sending/."""
    rooms = _grouped(GRAPH, _dataplane_room)
    assert _cycles(rooms) == []
    assert set(rooms) == set(DATAPLANE_ROOMS), "a new room of dataplane/ takes its place in DATAPLANE_ROOMS"
    upward = {
        (room, target)
        for room, targets in rooms.items()
        for target in targets
        if DATAPLANE_ROOMS.index(target) > DATAPLANE_ROOMS.index(room)
    }
    assert upward == set()


def test_a_tie_between_two_rooms_of_the_data_plane_is_seen():
    tie = {
        "smtriton.serve.dataplane.batching.coalescing": {"smtriton.serve.dataplane.sending.upstream"},
        "smtriton.serve.dataplane.sending.upstream": {"smtriton.serve.dataplane.batching.rule"},
        "smtriton.serve.dataplane.batching.rule": set(),
        "smtriton.serve.http.worker": {"smtriton.serve.dataplane.plane"},
    }
    assert _cycles(tie) == []
    assert _cycles(_grouped(tie, _dataplane_room)) == [["batching", "sending"]]


MAX_MODULE_LINES = 600  # past this a module holds more than one job
MAX_DATAPLANE_MODULE_LINES = 450  # the data plane's modules, each one step of a request's life


def test_no_module_of_smtriton_is_longer_than_the_limit():
    """A module that grows past this holds more than one job: split it by job (docs/design.md §4)."""
    long = {
        name: count
        for name, path in MODULES.items()
        if (count := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_module_of_the_data_plane_is_longer_than_its_limit():
    """The data plane is read as a request lives: a module past this holds more than one step of it
    (docs/design.md §4)."""
    long = {
        name: count
        for name, path in MODULES.items()
        if name.startswith("smtriton.serve.dataplane")
        and (count := len(path.read_text().splitlines())) > MAX_DATAPLANE_MODULE_LINES
    }
    assert long == {}
