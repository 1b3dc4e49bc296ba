"""Collection names: the alphabet every entry point checks, because a name
becomes a directory name here and a key segment in cluster mode."""

from __future__ import annotations

import re
from typing import Any

from shardmgr.errors import BadName

MAX_NAME = 128
"""Longest collection name, in characters."""
NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_NAME - 1}}}")
"""The collection name alphabet: ASCII letters and digits, then also '.', '_' and '-'.
A name becomes a directory name, so no separators, control characters or leading dots."""


def check_name(name: Any) -> str:
    """``name`` if it is a valid collection name; else BadName."""
    if not isinstance(name, str) or not NAME.fullmatch(name):  # fullmatch: "$" would accept "abc\n"
        raise BadName(f"collection name must be 1-{MAX_NAME} of letters, digits, '.', '_' or '-' (not first), "
                      f"got {name!r}")
    return name
