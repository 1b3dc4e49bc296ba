"""Test kit for the journal layer (shipped with the package, used by tests)."""

from .powercut import CutReport, PowerCut

__all__ = ["PowerCut", "CutReport"]
