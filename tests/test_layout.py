"""The layout's rules, checked by walking every product module's imports (no import is executed).

- no import cycle among the product's modules, counting the imports inside functions;
- ``scheduler_core`` imports only numpy, the standard library and itself;
- the scheduling path (``extender``, ``consolidation``, ``state``, ``scoring``, ``k8s``) never reaches the simulators;
- nothing installed imports ``testing`` or ``bench`` at module level, and ``cdk`` never imports the CLI;
- no two folders import each other (a top-level package, or a subpackage of ``scheduler_core`` or
  ``lambdas``), counting the imports inside functions: each pair of folders has one direction.
"""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import REPO

PRODUCT = ("scheduler_core", "adapters", "application", "gpu_scheduler", "lambdas", "manifests", "shares")
SIMULATORS = ("scheduler_core.simulator.simulate", "scheduler_core.simulator.locality_sim")
EVERY_FOLDER = (*PRODUCT, "cdk", "testing", "bench", "tools")
SCHEDULING_PATH = (
    "scheduler_core.extender",
    "scheduler_core.consolidation",
    "scheduler_core.state",
    "scheduler_core.scoring",
    "scheduler_core.k8s",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules(*packages: str) -> dict[str, Path]:
    return {_module_name(p): p for pkg in packages for p in sorted((REPO / pkg).rglob("*.py"))}


def _imports(path: Path, *, top_level_only: bool) -> set[str]:
    """Every module ``path`` imports (``from a import b`` counts ``a.b`` too, in case ``b`` is a module);
    with ``top_level_only``, only what runs at import time, ``if TYPE_CHECKING:`` blocks aside."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            elif not top_level_only or isinstance(node, ast.If | ast.Try | ast.With):
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.stmt):
                        visit([child])
                if isinstance(node, ast.If | ast.Try):
                    for block in (getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                        visit(block)
                    for handler in getattr(node, "handlers", []):
                        visit(handler.body)

    visit(tree.body)
    return found


def graph(*, top_level_only: bool = True) -> dict[str, set[str]]:
    """Product module -> the product modules it imports (a package's ``__init__`` importing its own
    submodules, ``from pkg import sub``, is not an edge to itself)."""
    known = modules(*PRODUCT)
    return {
        name: (_imports(path, top_level_only=top_level_only) & known.keys()) - {name} for name, path in known.items()
    }


def reachable(start: str, edges: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_product_has_no_import_cycle_not_even_through_a_lazy_import() -> None:
    edges = graph(top_level_only=False)
    cycles = sorted(name for name in edges if name in reachable(name, edges))
    assert cycles == [], f"modules on an import cycle: {cycles}"


def test_the_core_imports_only_numpy_msgspec_the_standard_library_and_itself() -> None:
    allowed_roots = set(sys.stdlib_module_names) | {"numpy", "msgspec", "scheduler_core", "__future__"}
    found = {
        (name, imported)
        for name, path in modules("scheduler_core").items()
        for imported in _imports(path, top_level_only=False)
        if imported.split(".")[0] not in allowed_roots
    }
    assert found == set(), found


def test_the_scheduling_path_never_reaches_the_simulators() -> None:
    edges = graph(top_level_only=False)
    leaks = {
        (name, target)
        for name in edges
        if name.startswith(SCHEDULING_PATH)
        for target in reachable(name, edges)
        if target.startswith(SIMULATORS)
    }
    assert leaks == set(), leaks


@pytest.mark.parametrize("forbidden", ["testing", "bench"])
def test_nothing_installed_imports_the_doubles_or_the_benchmarks_at_module_level(forbidden: str) -> None:
    found = {
        (name, imported)
        for name, path in modules(*PRODUCT).items()
        for imported in _imports(path, top_level_only=True)
        if imported.split(".")[0] == forbidden
    }
    assert found == set(), found


def test_cdk_takes_the_manifests_from_their_own_package_not_from_the_cli() -> None:
    found = {
        (name, imported)
        for name, path in modules("cdk").items()
        for imported in _imports(path, top_level_only=False)
        if imported.split(".")[0] in ("gpu_scheduler", "testing", "bench")
    }
    assert found == set(), found


def folder(path: Path) -> str:
    """The folder a module lives in, for the one-direction rule: a top-level package, or a subpackage of
    ``scheduler_core`` or ``lambdas`` (``scheduler_core/state/ledger.py`` -> ``scheduler_core.state``,
    ``scheduler_core/errors.py`` -> ``scheduler_core``, ``adapters/kube.py`` -> ``adapters``)."""
    parts = path.relative_to(REPO).parent.parts
    return ".".join(parts[:2] if parts[0] in ("scheduler_core", "application", "lambdas") else parts[:1])


def folder_edges() -> dict[tuple[str, str], set[str]]:
    """(importing folder, imported folder) -> the importing modules, lazy imports included."""
    known = modules(*EVERY_FOLDER)
    edges: dict[tuple[str, str], set[str]] = {}
    for name, path in known.items():
        for imported in _imports(path, top_level_only=False) & known.keys():
            pair = (folder(path), folder(known[imported]))
            if pair[0] != pair[1]:
                edges.setdefault(pair, set()).add(name)
    return edges


def test_no_two_folders_import_each_other() -> None:
    edges = folder_edges()
    both_ways = {
        f"{a} <-> {b}: {sorted(edges[(a, b)])} / {sorted(edges[(b, a)])}"
        for (a, b) in edges
        if (b, a) in edges and a < b
    }
    assert both_ways == set(), both_ways


def literal_statuses(path: Path, root: Path = REPO) -> list[str]:
    """Each ``Answer(...)`` or ``Reply(...)`` in ``path`` whose first argument is a number: a status decided
    outside :data:`scheduler_core.extender.wire.STATUS`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", "")) in ("Answer", "Reply")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, int)
        ):
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_every_reply_takes_its_status_from_the_one_table() -> None:
    assert [hit for path in modules(*PRODUCT).values() for hit in literal_statuses(path)] == []


def test_the_status_check_sees_a_number(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("Answer(404, b'')\nAnswer(STATUS['no_route'], b'')\nx.Reply(200, b'')\n")
    assert literal_statuses(probe, tmp_path) == ["probe.py:1", "probe.py:3"]


def test_the_walker_sees_a_cycle_and_a_forbidden_import(tmp_path: Path) -> None:
    """The rules above can fail: the walker finds what they look for."""
    (tmp_path / "a.py").write_text("import b\nfrom testing.moto import moto_server\n")
    (tmp_path / "b.py").write_text("def f():\n    import boto3\n\nfrom a import x\n")
    assert _imports(tmp_path / "a.py", top_level_only=True) == {"b", "testing.moto", "testing.moto.moto_server"}
    assert _imports(tmp_path / "b.py", top_level_only=True) == {"a", "a.x"}
    assert "boto3" in _imports(tmp_path / "b.py", top_level_only=False)
    assert "a" in reachable("a", {"a": {"b"}, "b": {"a"}})
    paths = ("scheduler_core/state/ledger.py", "scheduler_core/errors.py", "scheduler_core/placement/policies/fgd.py")
    assert [folder(REPO / p) for p in paths] == ["scheduler_core.state", "scheduler_core", "scheduler_core.placement"]
    assert [folder(REPO / p) for p in ("lambdas/extender/__init__.py", "gpu_scheduler/commands/serve.py")] == [
        "lambdas.extender",
        "gpu_scheduler",
    ]
