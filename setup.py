"""The package's build: the per-request path compiled with mypyc, the rest plain Python.

The metadata is in pyproject.toml; this file only adds the extension modules.
Which modules: shardmgr/build.py (``COMPILED``). ``SHARDMGR_BUILD=pure`` builds
none of them. Each extension is optional, so a machine without a C compiler installs
the pure-Python package (with a warning) instead of failing.
"""

from __future__ import annotations

import os
import runpy
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
TARGET = "build"
"""Where mypyc writes the C it generates."""


def compiled_extensions() -> list[Extension]:
    build = runpy.run_path(str(ROOT / "shardmgr" / "build.py"))
    if build["wanted"]() == "pure":
        return []
    from mypyc.build import mypycify  # a build requirement (pyproject.toml)

    modules = build["COMPILED"]
    paths = [name.replace(".", "/") + ".py" for name in modules]
    # multi_file: the generated C in several files, compiled side by side (ParallelBuildExt below).
    # The group's shared library goes inside a package (a top-level one is not found through an
    # editable install), and into common, whose __init__ imports nothing: a module's shim importing
    # it cannot start an import cycle.
    #
    # The build's isolated environment has mypy but not numpy or faiss, so their types are Any there:
    # two of --strict's warnings (pyproject.toml) then fire where `mypy --strict` in CI, with them
    # installed, is clean. Type checking is CI's; this only compiles.
    checks = ["--no-warn-return-any", "--no-warn-unused-ignores"]
    extensions = mypycify(checks + paths, opt_level="3", multi_file=True, group_name=build["GROUP"],
                          target_dir=TARGET)
    for extension in extensions:
        extension.optional = True  # no compiler: the pure-Python modules are used
        # mypyc writes a dotted group's headers under its package's folder (build/common), where
        # the modules' C files (in build/) do not look
        extension.include_dirs.append(os.path.join(TARGET, *build["GROUP"].split(".")[:-1]))
    return extensions


class ParallelBuildExt(build_ext):
    """build_ext that compiles one extension's C files side by side.

    setuptools' own ``parallel`` builds several extensions at once but each
    one's sources in turn, and mypyc puts nearly all the C in one shared
    library (the group): built serially, that is most of the install time."""

    def build_extension(self, ext: Extension) -> None:
        compile_each = self.compiler.compile

        def compile_all(sources: list[str], *args: Any, **kwargs: Any) -> list[str]:
            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                objects = pool.map(lambda source: compile_each([source], *args, **kwargs), sources)
                return [name for names in objects for name in names]

        self.compiler.compile = compile_all  # type: ignore[method-assign]
        try:
            super().build_extension(ext)
        finally:
            del self.compiler.compile  # the instance attribute: the class's method again


setup(ext_modules=compiled_extensions(), cmdclass={"build_ext": ParallelBuildExt})
