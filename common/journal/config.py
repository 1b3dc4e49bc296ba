"""Typed, frozen configuration for the journal layer.

Defaults and units live here and nowhere else; the CLI and the services
read them from these classes.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from common.units import KiB, MiB

Preallocate = Literal["sparse", "fallocate", "zero"]


@dataclasses.dataclass(frozen=True, slots=True)
class JournalConfig:
    """How a journal is laid out and grown. Checked by :meth:`validate`."""

    #: Record starts are aligned to this many bytes (power of two, 8..4096).
    #: Stored in the header at creation; reopening uses the stored value.
    alignment: int = 8
    #: Largest record body accepted, in bytes (at most 2**28 - 1).
    max_record_bytes: int = 64 * MiB
    #: The file grows in steps of this many bytes, ahead of the records.
    extent_bytes: int = 16 * MiB
    #: How growth reserves space: ``sparse`` (ftruncate), ``fallocate``
    #: (posix_fallocate) or ``zero`` (write zeros). See docs/benchmarks.md.
    preallocate: Preallocate = "fallocate"
    #: Appends that would take the file past this size raise JournalFull;
    #: ``None`` means unlimited. Segmented users (the queue) rotate on it.
    capacity_bytes: int | None = None

    def validate(self) -> JournalConfig:
        """Return self, or raise ValueError naming the bad setting."""
        a = self.alignment
        if a < 8 or a > 4096 or a & (a - 1):
            raise ValueError(f"alignment must be a power of two in 8..4096, got {a}")
        if not 0 < self.max_record_bytes < 2**28:
            raise ValueError(f"max_record_bytes must be in 1..{2**28 - 1}, got {self.max_record_bytes}")
        if self.extent_bytes < 4 * KiB or self.extent_bytes % (4 * KiB):
            raise ValueError(f"extent_bytes must be a positive multiple of 4096, got {self.extent_bytes}")
        if self.preallocate not in ("sparse", "fallocate", "zero"):
            raise ValueError(f"preallocate must be sparse, fallocate or zero, got {self.preallocate!r}")
        if self.capacity_bytes is not None and self.capacity_bytes < 8 * KiB:
            raise ValueError(f"capacity_bytes must be at least 8192, got {self.capacity_bytes}")
        return self


@dataclasses.dataclass(frozen=True, slots=True)
class FlusherConfig:
    """The group-commit flusher's schedule."""

    #: Seconds between flush rounds. A write is durable at the end of the
    #: first round that starts after it; waiters see at most about
    #: ``interval + one fdatasync`` of latency.
    interval: float = 0.005

    def validate(self) -> FlusherConfig:
        if not 0.0 < self.interval <= 3600.0:
            raise ValueError(f"flush interval must be in (0, 3600] seconds, got {self.interval}")
        return self
