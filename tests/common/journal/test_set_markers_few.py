"""Setting a few markers (pwrite each) changes what the batch path changes,
and set_markers_sized counts what sizes() counts."""

from __future__ import annotations

import tempfile
from pathlib import Path
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from common.journal import Flusher, FlusherConfig, Journal, Marker, RecordNotFound, marking
from common.journal.header import HEADER_SIZE
from common.journal.record import SMALL_BATCH

BODIES = [bytes([i]) * (i * 37 % 300) for i in range(20)]


def _run(root: Path, flusher: Flusher, first: list[tuple[list[int], Marker]], offsets: list[int], marker: Marker,
         expect: Marker | None, proven: bool, path: str, sized: bool) -> tuple[object, bytes, dict[Marker, int], int]:
    """Append BODIES, apply ``first`` markers, then the call under test along ``path``."""
    journal = Journal.create(root / "j", kind=b"TEST", flusher=flusher)
    starts = journal.append_batch(BODIES).offsets.tolist()
    for indexes, mark in first:
        journal.set_markers([starts[i] for i in indexes], mark)
    asked = [starts[o] if o < len(starts) else HEADER_SIZE + 3 * o for o in offsets]  # some are no record start
    small = SMALL_BATCH if path != "batch" else -1
    failing = mock.patch("os.pwrite", side_effect=OSError(5, "EIO")) if path == "no pwrite" \
        else mock.patch.object(marking, "_MARKER_BYTES", marking._MARKER_BYTES)
    with mock.patch.object(marking, "SMALL_BATCH", small), failing:
        try:
            if sized:
                try:
                    expected: int | None = int(journal.sizes(sorted(set(asked)), proven=proven).sum())
                except RecordNotFound:
                    expected = None  # set_markers_sized must refuse them too (compared across paths)
                ticket, size = journal.set_markers_sized(asked, marker, expect=expect, proven=proven)
                assert size == expected
                answer: object = (ticket.seq, size)
            else:
                answer = journal.set_markers(asked, marker, expect=expect, proven=proven).seq
        except Exception as exc:  # the same error, whichever path
            answer = (type(exc).__name__, str(exc).replace(str(root), "ROOT"))
    state = (answer, bytes(journal._file.bytes[HEADER_SIZE:journal.end]), journal.counters, journal.count)
    journal.close()
    return state


markers = st.sampled_from(list(Marker))


@settings(max_examples=80)
@given(first=st.lists(st.tuples(st.lists(st.integers(0, 19), min_size=1, max_size=12), markers), max_size=3),
       offsets=st.lists(st.integers(0, 23), min_size=1, max_size=SMALL_BATCH), marker=markers,
       expect=st.none() | markers, proven=st.booleans(), sized=st.booleans())
def test_a_few_markers_change_as_a_batch_of_them_does(first: list[tuple[list[int], Marker]], offsets: list[int],
                                                       marker: Marker, expect: Marker | None, proven: bool,
                                                       sized: bool) -> None:
    results = []
    with Flusher(FlusherConfig(interval=3600)) as flusher:
        for path in ("few", "batch", "no pwrite"):
            with tempfile.TemporaryDirectory() as root:
                results.append(_run(Path(root), flusher, first, offsets, marker, expect, proven, path, sized))
    assert results[0] == results[1] == results[2]
