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


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any("dataclass" in ast.unparse(decorator) for decorator in node.decorator_list)


def _init_problems(node: ast.ClassDef) -> list[str]:
    """What is wrong with a dataclass's written-out ``__init__``: missing, or
    parameters other than its fields in order with their defaults (a field
    made by ``dataclasses.field(default_factory=...)`` defaults to None)."""
    fields = [s for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    init = next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
    if init is None:
        return ["no __init__"]
    wanted = []
    for field in fields:
        default = field.value
        if isinstance(default, ast.Call) and ast.unparse(default.func).endswith("field"):
            keywords = {k.arg: k.value for k in default.keywords}
            default = ast.Constant(None) if "default_factory" in keywords else keywords.get("default")
        wanted.append((field.target.id, None if default is None else ast.unparse(default)))
    args = init.args.args[1:]
    defaults = [None] * (len(args) - len(init.args.defaults)) + [ast.unparse(d) for d in init.args.defaults]
    given = [(arg.arg, default) for arg, default in zip(args, defaults)]
    assigned = {ast.unparse(target).removeprefix("self.") for s in ast.walk(init) if isinstance(s, ast.Assign)
                for target in s.targets} | {s.args[1].value for s in ast.walk(init) if isinstance(s, ast.Call)
                                            and ast.unparse(s.func) == "object.__setattr__"}
    problems = [] if given == wanted else [f"parameters {given}, fields {wanted}"]
    return problems + [f"{name} not set" for name, _ in wanted if name not in assigned]


def test_every_dataclass_of_a_listed_module_writes_out_its_fields_init() -> None:
    """The ``__init__`` dataclasses generates is exec'd source: it runs
    interpreted even in the compiled build (14 of them cost a sixteenth of a
    one-item work item, and a frozen one's is slower still). A written-out
    one is compiled; it must take exactly the fields, in order, with their
    defaults, so that it cannot drift from the dataclass it stands in for."""
    found = []
    for name in build.COMPILED:
        path = ROOT / (name.replace(".", "/") + ".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and _is_dataclass(node):
                found += [f"{path.relative_to(ROOT)}:{node.name}: {p}" for p in _init_problems(node)]
    assert found == []


#: module constants that tests patch to switch a path (a Final one cannot be patched in the compiled build)
PATCHED_CONSTANTS = {"SMALL_BATCH", "_MARKER_BYTES", "TICK_S", "COMPACT_AFTER", "JOINED_FRAME_BYTES",
                     "SMALL_PART_BYTES", "CHECKPOINT_LAG_S", "REST_AFTER_S"}


def test_every_constant_of_a_listed_module_is_final() -> None:
    """A plain module global is a dictionary lookup at every use in compiled
    code; a ``Final`` one is inlined or a C static (docs/architecture.md)."""
    found = []
    for name in build.COMPILED:
        path = ROOT / (name.replace(".", "/") + ".py")
        for node in ast.parse(path.read_text()).body:
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
                continue
            target = node.targets[0].id
            is_typevar = isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "TypeVar"
            if target.lstrip("_")[:1].isupper() and target.isupper() and not is_typevar \
                    and target not in PATCHED_CONSTANTS:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {target}")
    assert found == []
