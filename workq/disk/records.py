"""The queue's on-disk record bodies, on top of the journal format.

Input segments are journals of kind ``WQSG``, one per key; metadata is a
msgpack map ``{segment, model, shape, lane}``. Each record is one task::

    0   8   job id        uint64: the first 8 bytes of blake2b(job name)
    8   8   position      uint64: the task's index in its job
    16  8   enqueued_ns   uint64: wall clock at enqueue
    24  n   payload

Completion logs are journals of kind ``WQCL``, segmented per job; metadata is
``{job, job_id, seq}``. Each record is a result, or a ledger entry::

    0   8   handle        uint64: the packed input handle; LEDGER for a ledger entry
    8   8   position      uint64: the input's position in its job
    16  8   completed_ns  uint64
    24  n   result payload (ledger: msgpack {collected_below, results, max_position})

Input markers: LIVE (pending or leased), RETIRED (its result is recorded),
BURIED (failed too often; kept for an operator). Result markers: LIVE (not
yet delivered) and DELIVERED. Recovery reads the markers and the fixed
24-byte heads above, never the payloads.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import numpy as np

#: Where each file lives under ``DATA/workq`` (named once, here).
SEGMENTS_DIR, RESULTS_DIR = "segments", "results"
SEGMENT_SUFFIX, RESULTS_SUFFIX = ".wqsg", ".wqcl"
#: ``DATA/<this>/workq``: where ``verify --repair`` moves damaged queue files
#: (see :func:`quarantine_name`).
QUARANTINE_DIR: Final = "quarantine"

SEGMENT_KIND: Final = b"WQSG"
RESULTS_KIND: Final = b"WQCL"
HEAD_BYTES: Final = 24
JOB_AT, POSITION_AT, TIME_AT = 0, 8, 16
HANDLE_AT: Final = 0
LEDGER: Final = np.uint64(2**64 - 1)
MAX_JOB_NAME: Final = 255


def job_id(name: str) -> int:
    """The 64-bit id of a job name (stable across processes and versions)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def check_job(name: object) -> str:
    """The job name, checked; ValueError naming the problem."""
    if not isinstance(name, str) or not 0 < len(name.encode()) <= MAX_JOB_NAME or "\0" in name:
        raise ValueError(f"job must be a non-empty string of at most {MAX_JOB_NAME} bytes, got {name!r}")
    return name


def heads(first: np.ndarray | np.integer | int, second: np.ndarray | int, times_ns: int, n: int) -> np.ndarray:
    """``n`` 24-byte record heads (uint8 [n, 24]) from three uint64 columns."""
    out = np.empty((n, 3), dtype="<u8")
    out[:, 0] = first
    out[:, 1] = second
    out[:, 2] = times_ns
    return out.view(np.uint8).reshape(n, HEAD_BYTES)


HEAD: Final = struct.Struct("<QQQ")
"""A record head as plain ints: job (or handle), position, time (JOB_AT, POSITION_AT, TIME_AT)."""
assert HEAD.size == HEAD_BYTES and (JOB_AT, POSITION_AT, TIME_AT) == (0, 8, 16)


def heads_few(first: Sequence[int], second: Sequence[int], times_ns: int) -> bytes:
    """:func:`heads`' bytes for a few records from plain ints, as a journal
    prefix of bytes rows (one struct call per head instead of a dozen numpy
    calls per batch)."""
    return b"".join([HEAD.pack(a, b, times_ns) for a, b in zip(first, second)])


def as_ints(column: list[int] | np.ndarray) -> list[int]:
    """A column of offsets, handles or positions as plain ints (a list is taken as it is, not copied)."""
    return column.tolist() if isinstance(column, np.ndarray) else column


def segment_file(segment_id: int) -> str:
    """``segments/<this>``: an input segment's file name."""
    return f"{segment_id:010d}{SEGMENT_SUFFIX}"


def job_dir(job: int) -> str:
    """``results/<this>/``: a job's completion-log directory (also the
    stand-in name of a job whose name was lost with its log)."""
    return f"{job:016x}"


def log_file(seq: int) -> str:
    """``results/<job>/<this>``: a completion-log segment's file name."""
    return f"{seq:08d}{RESULTS_SUFFIX}"


def quarantine_name(relative: Path, stamp: str) -> str:
    """The name a queue file at ``relative`` (under ``DATA/workq``) gets in
    ``DATA/quarantine/workq``: its path with ``_`` for ``/``, then the time,
    e.g. ``segments_0000000003.wqsg-20261201T101500``. Recovery reads the
    segment ids back from these names (:func:`quarantined_segment_ids`)."""
    return "_".join(relative.parts) + f"-{stamp}"


_QUARANTINED_SEGMENT: Final = re.compile(rf"^{SEGMENTS_DIR}_(\d+){re.escape(SEGMENT_SUFFIX)}-")


def quarantined_segment_ids(root: Path) -> list[int]:
    """Ids of the input segments moved to quarantine from ``root`` (``DATA/workq``)."""
    directory = root.parent / QUARANTINE_DIR / root.name
    if not directory.is_dir():
        return []
    return [int(m.group(1)) for p in directory.iterdir() if (m := _QUARANTINED_SEGMENT.match(p.name))]
