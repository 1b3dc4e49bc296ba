"""The package's build: the per-request path compiled with mypyc, the rest plain Python.

The metadata is in pyproject.toml; this file only adds the extension modules.
Which modules: shardmgr/build.py (``COMPILED``). ``SHARDMGR_COMPILE=1`` builds
them (opt-in for now). Each extension is optional, so a machine without a C compiler installs
the pure-Python package (with a warning) instead of failing.
"""

from __future__ import annotations

import os
import runpy
from pathlib import Path

from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent


def compiled_extensions() -> list[Extension]:
    # opt-in until every default test passes on the compiled build (issue 24, in progress)
    if os.environ.get("SHARDMGR_COMPILE", "") in ("", "0"):
        return []
    from mypyc.build import mypycify  # a build requirement (pyproject.toml)

    modules = runpy.run_path(str(ROOT / "shardmgr" / "build.py"))["COMPILED"]
    paths = [name.replace(".", "/") + ".py" for name in modules]
    # multi_file: the generated C in several files, compiled in parallel (build_ext's parallel below)
    extensions = mypycify(paths, opt_level="3", multi_file=True, group_name="shardmgr_compiled")
    for extension in extensions:
        extension.optional = True  # no compiler: the pure-Python modules are used
    return extensions


setup(ext_modules=compiled_extensions(), options={"build_ext": {"parallel": os.cpu_count() or 1}})
