"""The completion log's small append path writes what its batch path writes."""

from __future__ import annotations

import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from common.journal import Flusher, FlusherConfig
from common.journal.header import HEADER_SIZE
from common.journal.record import SMALL_BATCH
from workq.disk import completion_log
from workq.disk.completion_log import CompletionLog
from workq.disk.records import HEAD_BYTES, LEDGER, heads, heads_few

SEGMENT_BYTES = 8192 + 16384  # room for about 16 KiB of results per segment


Answer = tuple[int, int, str, int]  # tickets, written, error type, max_position


def _append_all(root: Path, flusher: Flusher, calls: list[list[int]], small: bool) -> tuple[list[Answer], list[bytes]]:
    """Append each call's results (payload sizes) to a fresh log; returns what
    each append answered and every segment's records, byte for byte."""
    log = CompletionLog.create(root, "job", 1, flusher, SEGMENT_BYTES)
    answers: list[Answer] = []
    position = 0
    with mock.patch.object(completion_log, "SMALL_BATCH", SMALL_BATCH if small else -1), \
            mock.patch("time.time_ns", return_value=1234):
        for sizes in calls:
            handles = np.arange(position, position + len(sizes), dtype=np.uint64) | np.uint64(7 << 32)
            positions = np.arange(position, position + len(sizes), dtype=np.uint64)
            payloads = [bytes([len(sizes) % 251]) * size for size in sizes]
            got = log.append(handles, positions, payloads)
            answers.append((len(got.tickets), got.written, type(got.error).__name__, log.max_position))
            position += len(sizes)
    files = [bytes(j._file.bytes[HEADER_SIZE:j.end]) for _, j in sorted(log.segments.items())]
    for journal in log.segments.values():
        journal.close()
    return answers, files


@settings(max_examples=60)
@given(calls=st.lists(st.lists(st.sampled_from([0, 1, 100, 1000, 3000, 7000, 9000, 30000]), min_size=1,
                               max_size=SMALL_BATCH), min_size=1, max_size=5))
def test_a_few_results_are_appended_as_the_batch_path_appends_them(calls: list[list[int]]) -> None:
    with Flusher(FlusherConfig(interval=3600)) as flusher, tempfile.TemporaryDirectory() as a, \
            tempfile.TemporaryDirectory() as b:
        small = _append_all(Path(a), flusher, calls, small=True)
        batch = _append_all(Path(b), flusher, calls, small=False)
    assert small == batch


@given(rows=st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)), max_size=SMALL_BATCH),
       now=st.integers(0, 2**64 - 1))
def test_heads_of_a_few_records_are_the_vectorised_heads(rows: list[tuple[int, int]], now: int) -> None:
    first, second = [r[0] for r in rows], [r[1] for r in rows]
    few = heads_few(first, second, now)
    many = heads(np.array(first, dtype=np.uint64), np.array(second, dtype=np.uint64), now, len(rows))
    assert many.shape == (len(rows), HEAD_BYTES) and type(few) is bytes and few == many.tobytes()
    assert heads_few([int(LEDGER)], [0], now) == heads(LEDGER, 0, now, 1).tobytes()


def test_the_comparison_sees_batches_span_segments_and_failures() -> None:
    with Flusher(FlusherConfig(interval=3600)) as flusher, tempfile.TemporaryDirectory() as a:
        answers, files = _append_all(Path(a), flusher, [[3000] * 8, [30000], [7000, 7000]], small=True)
    assert [x[:3] for x in answers] == [(2, 8, "NoneType"), (0, 0, "JournalFull"), (1, 2, "NoneType")]
    assert len(files) >= 3
