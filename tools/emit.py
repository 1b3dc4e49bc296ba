"""How every benchmark prints its results: one JSON document, or its tables."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def emit(results: Any, as_json: bool, show: Callable[[Any], None]) -> None:
    """Print ``results`` as indented JSON, or hand them to ``show``."""
    if as_json:
        print(json.dumps(results, indent=2))
    else:
        show(results)
