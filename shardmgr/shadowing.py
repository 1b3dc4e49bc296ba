"""The first thing ``import shardmgr`` does: check that the ``common`` package
found on ``sys.path`` is the project's (common_shadowing.py, shared with
workq; an ImportError naming what shadows it otherwise)."""

from __future__ import annotations

from common_shadowing import check

check("shardmgr")
