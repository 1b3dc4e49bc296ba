"""Read-only mappings without a file descriptor: readable after the
descriptor is closed, unmapped once the last reader is gone."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest

from common.journal.fdless import map_readonly


def mapped(path: Path) -> bool:
    return str(path) in Path("/proc/self/maps").read_text()


def test_rows_stay_readable_after_the_descriptor_closes_and_unmap_with_their_last_reader(tmp_path: Path) -> None:
    path = tmp_path / "rows"
    data = np.arange(5000, dtype=np.int64)
    path.write_bytes(data.tobytes())
    fd = os.open(path, os.O_RDONLY)
    before = len(os.listdir("/proc/self/fd"))
    buffer = map_readonly(fd, data.nbytes)
    os.close(fd)
    assert len(os.listdir("/proc/self/fd")) == before - 1  # no duplicate kept
    rows = np.frombuffer(buffer, dtype=np.int64)[100:200]
    del buffer
    gc.collect()
    np.testing.assert_array_equal(rows, data[100:200])  # the array keeps the mapping alive
    assert mapped(path)
    del rows
    gc.collect()
    assert not mapped(path)


def test_an_empty_or_bad_mapping_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        map_readonly(0, 0)
    path = tmp_path / "w"
    path.write_bytes(b"x" * 4096)
    fd = os.open(path, os.O_WRONLY)  # PROT_READ needs a readable descriptor
    try:
        with pytest.raises(OSError, match="mmap"):
            map_readonly(fd, 4096)
    finally:
        os.close(fd)
