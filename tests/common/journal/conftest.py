"""The journal tests' shared fixture: one fresh journal."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from common.journal import Flusher, Journal


@pytest.fixture
def journal(tmp_path: Path, flusher: Flusher) -> Iterator[Journal]:
    """A new journal at ``tmp_path / "j"`` (kind TEST, metadata "meta"), closed after the test."""
    j = Journal.create(tmp_path / "j", kind=b"TEST", flusher=flusher, metadata=b"meta")
    yield j
    j.close()
