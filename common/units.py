"""Byte units, named once: sizes in configuration read as ``64 * MiB``."""

from __future__ import annotations

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
