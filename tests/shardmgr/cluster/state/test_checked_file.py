"""CheckedFile, the download target that checksums pieces as they arrive:
pieces in any order give the file's crc32c; pieces that do not tile the
file once give None (the caller reads the file instead)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import crc32c

from shardmgr.cluster.state.checked_file import CheckedFile


def pieces(data: bytes, size: int) -> list[tuple[int, bytes]]:
    return [(offset, data[offset:offset + size]) for offset in range(0, len(data), size)]


def written(path: Path, parts: list[tuple[int, bytes]]) -> tuple[int, int] | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with CheckedFile(fd) as target:
            for offset, chunk in parts:
                assert target.seek(offset) == offset and target.tell() == offset
                assert target.write(chunk) == len(chunk) and target.tell() == offset + len(chunk)
        return target.checksum()
    finally:
        os.close(fd)


def test_ranges_in_any_order_give_the_files_checksum(tmp_path: Path) -> None:
    data = os.urandom(1_000_003)
    ranges = [pieces(data[lo:lo + 300_000], 7_777) for lo in range(0, len(data), 300_000)]
    for r, lo in zip(ranges, range(0, len(data), 300_000)):
        r[:] = [(lo + offset, chunk) for offset, chunk in r]
    random.Random(1).shuffle(ranges)  # each range in order, the ranges in any order
    order = [p for r in ranges for p in r]
    assert written(tmp_path / "f", order) == (crc32c.crc32c(data), len(data))
    assert (tmp_path / "f").read_bytes() == data
    assert written(tmp_path / "empty", []) == (0, 0)


def test_pieces_that_do_not_tile_the_file_once_give_no_checksum(tmp_path: Path) -> None:
    data = os.urandom(100_000)
    parts = pieces(data, 10_000)
    assert written(tmp_path / "twice", parts + [parts[3]]) is None  # a retried piece, written again
    assert written(tmp_path / "gap", parts[:4] + parts[5:]) is None
    assert written(tmp_path / "late start", parts[1:]) is None
