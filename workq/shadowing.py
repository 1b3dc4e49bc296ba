"""The ``common`` package workq imports is the project's: checked first, at
``import workq``. A user's own ``common.py`` (or ``common/``) earlier on
``sys.path`` (a script's own directory comes first) would shadow it, and
the first ``import common.journal`` would fail with a puzzling
``'common' is not a package``; this ImportError names both instead."""

from __future__ import annotations

from pathlib import Path

import common

if getattr(common, "PROJECT", None) != "shardmgr":  # (common/__init__.py)
    _theirs = getattr(common, "__file__", None) or ", ".join(getattr(common, "__path__", [])) or repr(common)
    raise ImportError(f"workq cannot import: the 'common' found first on sys.path is {_theirs}, not the "
                      f"project's package {Path(__file__).resolve().parents[1] / 'common'}, which it shadows; "
                      "rename that module or take its directory off sys.path (a script's own directory comes "
                      "first)", name="common", path=str(_theirs))
