"""Batch checksums of row files: in place (sealed, in pieces combined) and read (open)."""

from __future__ import annotations

import os
from pathlib import Path

import crc32c
import pytest

from shardmgr.verification.row_checksums import PIECE, batch_crcs


@pytest.mark.parametrize("sealed", [True, False])
def test_crcs_match_the_bytes_whatever_the_batch_size(tmp_path: Path, sealed: bool) -> None:
    data = os.urandom(2 * PIECE + 12345)
    path = tmp_path / "rows"
    path.write_bytes(data)
    spans = [(0, 0), (7, 100), (4096, 2 * PIECE + 1), (100, len(data) - 100), (len(data) - 5, 10)]
    want = [crc32c.crc32c(data[o:o + n]) for o, n in spans[:-1]] + [None]  # the last runs past the end
    assert batch_crcs(path, spans, sealed) == want


def test_an_empty_span_at_a_page_aligned_end(tmp_path: Path) -> None:
    path = tmp_path / "rows"
    path.write_bytes(b"\1" * 8192)
    assert batch_crcs(path, [(0, 8192), (8192, 0)], sealed=True) == [crc32c.crc32c(b"\1" * 8192), 0]
