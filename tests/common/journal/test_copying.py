"""copy_prefix: a file's first bytes, copied by the kernel on one file
system and by reads and writes across two (where copy_file_range says
EXDEV, as Linux >= 5.19 does between a tmpfs and a disk)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from common.journal.copying import copy_prefix

DATA = os.urandom(3 * 1024 * 1024 + 17)


def test_a_prefix_is_copied_on_one_file_system_and_short_sources_are_refused(tmp_path: Path) -> None:
    (tmp_path / "src").write_bytes(DATA)
    assert copy_prefix(tmp_path / "src", tmp_path / "dest", len(DATA) - 5) == len(DATA) - 5
    assert (tmp_path / "dest").read_bytes() == DATA[:-5]
    with pytest.raises(OSError, match="5 bytes short"):
        copy_prefix(tmp_path / "src", tmp_path / "long", len(DATA) + 5)


def test_a_prefix_is_copied_across_file_systems(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a file system of its own")
    with tempfile.TemporaryDirectory(dir=shm) as other:
        (Path(other) / "src").write_bytes(DATA)
        assert copy_prefix(Path(other) / "src", tmp_path / "dest", len(DATA) - 1) == len(DATA) - 1
    assert (tmp_path / "dest").read_bytes() == DATA[:-1]
