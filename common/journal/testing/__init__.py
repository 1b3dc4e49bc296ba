"""The journal layer's test kit, shipped with the package: the power-cut
simulator (``powercut``), which loses every write after the last completed
flush and may tear the last one. Part of the layer's contract, not a mock.

May import: the standard library only; it patches ``os`` calls, never the
journal's code.
"""

from .powercut import CutReport, PowerCut

__all__ = ["PowerCut", "CutReport"]
