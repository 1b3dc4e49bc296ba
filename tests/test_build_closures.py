"""The compiled build's closures: none may form a reference cycle.

mypyc keeps a function's nested ``def``s in the environment object their
closures share whenever one of its functions names a function as a free
variable. Its pre-build pass (mypyc/irbuild/prebuildvisitor.py) counts as
free any function symbol seen in a function and again in one nested in it
(either order), module-level, imported and builtin ones too: ``settle(...)``
in a method and again in a lambda inside it is enough. The environment then
holds the closures and the closures hold the environment, a cycle per call
that only the cyclic garbage collector frees: a durable completion left 36
such objects per call (issue 24), and collecting them cost 5 % of a work
item's instructions. This test replays that rule over the source of every
compiled module, and the queue's own test (tests/workq/test_garbage.py)
counts what a work item leaves for the collector in both builds.

The fix is to keep such names on one side: move the closures into a
module-level function of their own, or use a method and a lambda.
"""

from __future__ import annotations

import ast
import builtins
import importlib
from collections.abc import Callable
from pathlib import Path

from shardmgr import build

ROOT = Path(__file__).resolve().parents[1]
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
Scope = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda


class _FreeFunctions:
    """mypyc's free-variable bookkeeping for the function symbols of one module."""

    def __init__(self, is_function: Callable[[str], bool]) -> None:
        self.is_function = is_function
        self.parent: dict[Scope, Scope | None] = {}
        self.nested: dict[Scope, list[Scope]] = {}
        self.first_seen: dict[object, Scope] = {}
        self.free: dict[Scope, set[object]] = {}
        self.stack: list[Scope] = []

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, FUNCTIONS):
            self._function(node)
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and self.stack:
            symbol = self._resolve(node.id)
            if symbol is not None:
                self._seen(symbol)
        for child in ast.iter_child_nodes(node):
            self.visit(child)

    def _function(self, node: Scope) -> None:
        outer = self.stack[-1] if self.stack else None
        self.parent[node] = outer
        self.nested.setdefault(node, [])
        if outer is not None:
            self.nested[outer].append(node)
        self.stack.append(node)
        for child in ast.iter_child_nodes(node):
            if not (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and child in node.decorator_list):
                self.visit(child)
        self.stack.pop()
        if isinstance(node, ast.FunctionDef) and self.stack:
            self._seen(node)  # a nested def's own name is seen where it is defined

    def _resolve(self, name: str) -> object | None:
        for scope in reversed(self.stack):
            for inner in self.nested.get(scope, []):
                if isinstance(inner, ast.FunctionDef) and inner.name == name:
                    return inner
            if name in _bound(scope):
                return None  # a variable: free or not, never a cycle
        return ("function", name) if self.is_function(name) else None

    def _within(self, outer: Scope, inner: Scope) -> bool:
        parent = self.parent.get(inner)
        return parent is not None and (parent is outer or self._within(outer, parent))

    def _seen(self, symbol: object) -> None:
        here = self.stack[-1]
        first = self.first_seen.get(symbol)
        if first is None:
            self.first_seen[symbol] = here
        elif self._within(here, first):
            self.first_seen[symbol] = here
            self.free.setdefault(here, set()).add(symbol)
        elif self._within(first, here):
            self.free.setdefault(first, set()).add(symbol)

    def names_a_function(self, scope: Scope) -> bool:
        """mypyc's ``has_nested_func_self_reference``."""
        return bool(self.free.get(scope)) or any(self.names_a_function(inner) for inner in self.nested[scope])

    def cycles(self) -> list[Scope]:
        """Functions whose nested defs (or themselves, if nested) mypyc keeps in an environment."""
        return [scope for scope in self.nested
                if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef) and self.names_a_function(scope)
                and (self.parent[scope] is not None
                     or any(isinstance(inner, ast.FunctionDef) for inner in self.nested[scope]))]


def _bound(scope: Scope) -> set[str]:
    """Names a function binds itself (parameters, assignments, imports), not in nested functions."""
    args = scope.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if isinstance(node, FUNCTIONS):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        stack.extend(ast.iter_child_nodes(node))
    return names


def _problems(module: str) -> list[str]:
    loaded = importlib.import_module(module)

    def is_function(name: str) -> bool:
        value = getattr(loaded, name, getattr(builtins, name, None))
        return callable(value) and not isinstance(value, type)

    path = ROOT / (module.replace(".", "/") + ".py")
    visitor = _FreeFunctions(is_function)
    visitor.visit(ast.parse(path.read_text()))
    return [f"{path.relative_to(ROOT)}:{scope.lineno} {getattr(scope, 'name', 'lambda')}"
            for scope in visitor.cycles()]


def test_no_compiled_function_keeps_its_closures_in_a_cycle() -> None:
    problems = [problem for module in build.COMPILED for problem in _problems(module)]
    assert not problems, ("closures mypyc would keep in their environment (a reference cycle per call; "
                          f"see this module's docstring): {problems}")


def test_the_rule_finds_the_cycles_mypyc_makes() -> None:
    source = '''
def settle(x): pass

def shared(x):
    settle(x)
    def done():
        settle(x)
    return done

def one_side(x):
    def done():
        settle(x)
    return done, lambda: settle(x)

def calls_a_sibling(x):
    def a():
        return x
    def b():
        return a()
    return b

def a_method_and_a_lambda(x):
    settle(x)
    return lambda: x
'''
    visitor = _FreeFunctions(lambda name: name == "settle")
    visitor.visit(ast.parse(source))
    assert sorted(getattr(scope, "name", "") for scope in visitor.cycles()) == ["calls_a_sibling", "shared"]
