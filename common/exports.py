"""A package's public names loaded from their modules on first use (PEP 562),
so that importing the package, or one light name of it, does not import its
heavy modules (numpy, faiss, boto3).

A package lists its names in ``__all__``, imports them under
``TYPE_CHECKING`` for the type checker, and sets
``__getattr__ = exports.lazy(__name__, homes)``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: the name ``n`` comes from its
    module ``package.homes[n]`` (``homes[n] == n``: the module itself), is
    imported on first use and then kept in the package; other names raise
    AttributeError, as a module's missing attribute does."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(f"{package}.{home}")
        value = module if home == name else getattr(module, name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
