"""The package's shape, checked: modules that say they are pure are (policy/ above all), no
import cycles, and the command line does not import the kopf registrations."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "operator" / "gpusizer"

FORBIDDEN_MODULES = {
    "kopf",
    "kubernetes",
    "requests",
    "aiohttp",
    "urllib3",
    "socket",
    "time",
    "urllib",
    "http",
    "asyncio",
    "subprocess",
}
FORBIDDEN_CALLS = {"now", "utcnow", "today", "monotonic"}
SAYS_PURE = re.compile(r"(^|[\s.])Pure\b")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_file(name: str) -> Path | None:
    """The source of a gpusizer module (a package's __init__), None outside the package."""
    parts = name.split(".")
    if parts[0] != "gpusizer":
        return None
    base = PACKAGE_DIR.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _imported(module: Path) -> Iterator[str]:
    """Every name an import statement of `module` names, at any depth of the module."""
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _violations(module: Path, seen: set[Path]) -> list[str]:
    """Forbidden imports and clock reads in `module` and every gpusizer module it imports."""
    if module in seen:
        return []
    seen.add(module)
    found = []
    for name in _imported(module):
        if name.split(".")[0] in FORBIDDEN_MODULES:
            found.append(f"{module.name} imports {name}")
        inner = _module_file(name)
        if inner is not None:
            found += _violations(inner, seen)
    for node in ast.walk(ast.parse(module.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in FORBIDDEN_CALLS
        ):
            found.append(f"{module.name} calls .{node.func.attr}()")
    return found


def _says_pure(module: Path) -> bool:
    docstring = ast.get_docstring(ast.parse(module.read_text())) or ""
    return bool(SAYS_PURE.search(docstring))


ALL_MODULES = sorted(PACKAGE_DIR.rglob("*.py"))
PURE_MODULES = [m for m in ALL_MODULES if _says_pure(m)]


def test_every_policy_module_says_it_is_pure() -> None:
    policy = [m for m in ALL_MODULES if m.parent.name == "policy" and m.name != "__init__.py"]
    assert policy and [m for m in policy if not _says_pure(m)] == []


@pytest.mark.parametrize("module", PURE_MODULES, ids=_module_name)
def test_a_module_that_says_it_is_pure_imports_nothing_with_side_effects(module: Path) -> None:
    assert _violations(module, set()) == []


def test_the_purity_check_can_fail(tmp_path: Path) -> None:
    impure = tmp_path / "impure.py"
    impure.write_text(
        '"""Pure, it says."""\nimport time\nfrom datetime import datetime\nNOW = datetime.now()\n'
    )
    assert _says_pure(impure)
    assert len(_violations(impure, set())) == 2


def _import_graph() -> dict[str, set[str]]:
    """gpusizer module -> the gpusizer modules it imports, anywhere in its code."""
    graph: dict[str, set[str]] = {}
    for path in ALL_MODULES:
        targets = {_module_name(found) for name in _imported(path) if (found := _module_file(name))}
        graph[_module_name(path)] = targets - {_module_name(path)}
    return graph


def _cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of modules (Tarjan), shown in import order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
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


def test_no_import_cycle_inside_the_package() -> None:
    graph = _import_graph()
    assert len(graph) > 40, "the graph covers the package"
    assert _cycles(graph) == []


def test_the_cycle_check_can_fail() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_the_command_line_never_imports_the_kopf_registrations() -> None:
    assert "gpusizer.handlers" not in _import_graph()["gpusizer.cli"]


def _reachable(graph: Mapping[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return seen


LOOP = {"gpusizer.reconcile", "gpusizer.workload", "gpusizer.clock", "gpusizer.handlers"}


@pytest.mark.parametrize(
    "module",
    [m for m in _import_graph() if m.startswith("gpusizer.activator")],
)
def test_the_activator_never_imports_the_operators_loop(module: str) -> None:
    """A second process of the package: it shares the API and the routes' rules, never the
    operator's turn (which would run kopf's registrations and the cycle clock with it)."""
    assert _reachable(_import_graph(), module) & LOOP == set()


def test_the_reachability_check_can_fail() -> None:
    assert _reachable({"a": {"b"}, "b": {"c"}}, "a") == {"a", "b", "c"}
    assert "gpusizer.reconcile" in _reachable(_import_graph(), "gpusizer.workload")
