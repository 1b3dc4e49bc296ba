"""The layers point one way (docs/architecture.md): every import of every
module, read statically, against the rules the packages' docstrings state."""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "workq", "shardmgr")
MODULES = ("common_shadowing",)  # top-level modules beside the packages

#: the cluster's rooms and the modules on top of them (shardmgr/cluster/__init__.py)
CLUSTER_PARTS = ("state", "published", "writer", "query", "operations", "testing", "node", "cluster_client")


def cluster_except(*allowed: str) -> tuple[str, ...]:
    """The cluster's rooms and top modules, but ``allowed`` (names in CLUSTER_PARTS)."""
    return tuple(f"shardmgr.cluster.{part}" for part in CLUSTER_PARTS if part not in allowed)


#: module prefix -> project modules it must not import (prefixes).
FORBIDDEN = {
    "common": ("workq", "shardmgr"),
    "common_shadowing": ("common.journal", "common.wire", "workq", "shardmgr"),  # `common` itself, nothing more
    "common.journal": ("common.wire",),
    "common.wire": ("common.journal",),
    "workq": ("shardmgr",),
    "workq.disk": ("workq.state", "workq.broker", "workq.loop", "workq.waiters", "workq.delivery", "workq.service",
                   "workq.client", "workq.worker"),
    "workq.state": ("workq.broker", "workq.loop", "workq.waiters", "workq.delivery", "workq.service",
                    "workq.client", "workq.worker"),
    "workq.protocol": ("workq.state", "workq.disk", "workq.broker", "workq.service", "common.journal"),
    "workq.client": ("workq.state", "workq.disk", "workq.broker", "workq.service", "common.journal"),
    "workq.worker": ("workq.state", "workq.disk", "workq.broker", "workq.service", "common.journal"),
    "shardmgr.store": ("shardmgr.server", "shardmgr.verification", "shardmgr.cli", "workq"),
    "shardmgr.server": ("shardmgr.verification", "shardmgr.cli"),
    "shardmgr.cluster": ("shardmgr.server", "shardmgr.verification", "shardmgr.cli", "workq"),
    "shardmgr.verification": ("shardmgr.server", "shardmgr.cli"),
    "shardmgr.snapshots": ("shardmgr.cli",),
    # cluster/'s rooms (shardmgr/cluster/__init__.py), bottom up: the base, state, published, then
    # writer, query and operations side by side; node and cluster_client on top; testing apart.
    **{f"shardmgr.cluster.{base}": cluster_except() for base in ("config", "errors", "passes", "backoff", "peers")},
    "shardmgr.cluster.state": cluster_except("state"),
    "shardmgr.cluster.published": cluster_except("state", "published"),
    **{f"shardmgr.cluster.{side}": cluster_except("state", "published", side) for side in ("writer", "query",
                                                                                           "operations")},
    "shardmgr.cluster.testing": cluster_except("testing"),
    "shardmgr.cluster.cluster_client": cluster_except("state", "cluster_client"),
    "shardmgr.cluster.node": cluster_except("state", "published", "writer", "query", "node"),
}


@functools.cache
def import_statements() -> dict[str, list[tuple[str, tuple[str, ...]]]]:
    """Each project module's import statements, every one (``TYPE_CHECKING``
    and function-level ones too), read once per run: ``(module, ())`` for
    ``import module``, ``(target, names)`` for ``from target import names``,
    a relative target made absolute."""
    found: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    files = [ROOT / f"{module}.py" for module in MODULES] + [p for d in PACKAGES for p in (ROOT / d).rglob("*.py")]
    for path in files:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        base = name.split(".") if is_package else name.split(".")[:-1]
        statements: list[tuple[str, tuple[str, ...]]] = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                statements.extend((a.name, ()) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base[: len(base) - node.level + 1]
                    target = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                statements.append((target, tuple(a.name for a in node.names)))
        found[name] = statements
    return found


@functools.cache
def modules() -> dict[str, set[str]]:
    """Each project module and the project names it imports (absolute: a
    module, or ``module.name`` for each name taken from it)."""
    found: dict[str, set[str]] = {}
    for name, statements in import_statements().items():
        imported = {target for target, _ in statements}
        imported.update(f"{target}.{n}" for target, names in statements for n in names)
        found[name] = {m for m in imported if m.split(".")[0] in PACKAGES + MODULES}
    return found


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_imports_upward(layer: str) -> None:
    wrong = sorted(f"{module} imports {target}" for module, targets in modules().items() if within(module, layer)
                   for target in targets for banned in FORBIDDEN[layer] if within(target, banned))
    assert wrong == [], wrong


def test_the_rules_cover_every_package() -> None:
    found = modules()
    assert len(found) > 60
    for layer in FORBIDDEN:
        assert any(within(m, layer) for m in found), f"no module in {layer}: the rule checks nothing"


def exported(package: str) -> set[str]:
    """The names a package's ``__init__.py`` exports (its ``__all__``, read statically)."""
    tree = ast.parse((ROOT / package.replace(".", "/") / "__init__.py").read_text())
    (names,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)]
    assert isinstance(names, ast.List)
    return {element.value for element in names.elts if isinstance(element, ast.Constant)}


def test_the_cluster_imports_the_store_through_its_face() -> None:
    """cluster/ imports ``shardmgr.store`` and the names it exports, never a module of the store by its path."""
    face = {"shardmgr.store"} | {f"shardmgr.store.{name}" for name in exported("shardmgr.store")}
    wrong = sorted(f"{module} imports {target}" for module, targets in modules().items()
                   if within(module, "shardmgr.cluster") for target in targets
                   if within(target, "shardmgr.store") and target not in face)
    assert wrong == [], wrong


FACES = ("shardmgr", "shardmgr.store", "shardmgr.server", "shardmgr.cluster", "shardmgr.verification")


@pytest.mark.parametrize("package", FACES)
def test_a_package_face_loads_every_name_it_exports(package: str) -> None:
    face = importlib.import_module(package)
    names = exported(package)
    assert names and sorted(face.__all__) == sorted(names)
    for name in names:
        assert getattr(face, name) is not None, name



@functools.cache
def module_graph() -> dict[str, set[str]]:
    """Each project module and the project modules it imports, every import
    counted: ``from p import n`` is an import of the module ``p.n`` where
    that is a module, else of ``p``."""
    statements = import_statements()
    graph: dict[str, set[str]] = {}
    for name, found in statements.items():
        edges = {target for target, names in found if not names}
        edges.update(f"{t}.{n}" if f"{t}.{n}" in statements else t for t, names in found for n in names)
        graph[name] = {e for e in edges if e in statements} - {name}
    return graph


def test_no_import_circle() -> None:
    """No module imports itself through others, counting every import: a
    cycle kept alive by a ``TYPE_CHECKING`` or a function-level import is a
    cycle too (the lower module takes a Protocol or a callable instead)."""
    graph = module_graph()
    done: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycles.append(path[path.index(module):] + [module])
            return
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, path + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)
