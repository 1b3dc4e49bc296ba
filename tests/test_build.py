"""The compiled build's module list (shardmgr/build.py) against the source tree."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from shardmgr import build

ROOT = Path(__file__).resolve().parent.parent
HARMLESS_TWICE = {"len", "min", "max", "int"}


def test_every_listed_module_exists() -> None:
    assert [name for name in build.COMPILED if importlib.util.find_spec(name) is None] == []


def test_this_install_is_the_build_it_was_asked_for() -> None:
    """Compiled unless SHARDMGR_BUILD=pure (set for the build and for the
    tests): a failed compile, or a stray extension module left in a pure
    tree, would make the tests run another build than the one named."""
    compiled = build.wanted() == "compiled"
    assert build.describe() == (f"compiled (mypyc, {len(build.COMPILED)} modules)" if compiled else "pure Python")


def test_no_compiled_module_is_older_than_its_source() -> None:
    """An edit to a listed module after the build would run the old code
    compiled (the extension is preferred to the .py): rebuild with the
    install line (``pip install -e '.[test]'``) after editing one."""
    library = importlib.util.find_spec(build.LIBRARY)
    if library is None or library.origin is None:
        pytest.skip("no compiled build here")
    built = Path(library.origin).stat().st_mtime
    stale = [name for name, compiled in build.compiled_modules().items()
             if compiled and (ROOT / (name.replace(".", "/") + ".py")).stat().st_mtime > built]
    assert stale == [], "edited after the build; rebuild: pip install -e '.[test]'"


def test_an_unknown_build_is_refused_naming_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(build.BUILD_VARIABLE, "fast")
    with pytest.raises(ValueError, match="SHARDMGR_BUILD='fast': expected one of compiled, pure"):
        build.wanted()


def test_no_listed_module_calls_a_function_in_a_slice_bound() -> None:
    """mypyc evaluates a slice bound twice when the sliced object is not a
    list, bytes or str (``view[os.write(fd, view):]`` wrote twice): a call
    with effects there must be assigned first."""
    found = []
    for name in build.COMPILED:
        path = ROOT / (name.replace(".", "/") + ".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Slice):
                for bound in (node.lower, node.upper, node.step):
                    for sub in ast.walk(bound) if bound is not None else ():
                        if isinstance(sub, ast.Call) and not (isinstance(sub.func, ast.Name)
                                                              and sub.func.id in HARMLESS_TWICE):
                            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(bound)}")
    assert found == []
