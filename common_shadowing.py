"""Is the ``common`` package found on ``sys.path`` the project's? Asked first
at ``import shardmgr`` and ``import workq`` (their ``shadowing`` modules),
before either imports anything of ``common``.

A user's own ``common.py`` (or ``common/``) earlier on ``sys.path`` (a
script's own directory comes first) would shadow the project's package,
and the first ``import common.journal`` would fail with a puzzling
``'common' is not a package``; :func:`check` raises an ImportError naming
both instead.

A top-level module of the distribution, beside its three packages: it
cannot live in ``common`` (the very package that may be shadowed), and in
``workq`` it would make ``import shardmgr`` import the whole queue first
(and its error name workq, not the package the user imported).
"""

from __future__ import annotations

from pathlib import Path


def check(package: str) -> None:
    """Return if ``common`` is the project's package (``common.PROJECT``);
    else raise ImportError saying that ``package`` cannot import, what
    shadows the project's ``common`` and what to do."""
    import common

    if getattr(common, "PROJECT", None) == "shardmgr":  # (common/__init__.py)
        return
    theirs = getattr(common, "__file__", None) or ", ".join(getattr(common, "__path__", [])) or repr(common)
    raise ImportError(f"{package} cannot import: the 'common' found first on sys.path is {theirs}, not the "
                      f"project's package {Path(__file__).resolve().parent / 'common'}, which it shadows; rename "
                      "that module or take its directory off sys.path (a script's own directory comes first)",
                      name="common", path=str(theirs))
