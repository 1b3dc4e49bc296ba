"""Checking one journal file offline: the journal layer's part of ``verify``.

:func:`check_journal` opens a journal read-only (no lock, nothing written, so
it is safe beside a live writer) and reports every :class:`Problem` it finds
with the file, the byte offset, what was expected and what was found:

* the header: magic, version, checksum (identity and metadata), the kind,
  the zero padding around the checkpoint slots, and each slot (empty, or
  passing its checksum);
* a sealed journal (default run, O(1)): the sealed checkpoint and the file
  size, which sealing trims to the last record;
* an unsealed journal, or any journal with ``deep``: the recovery walk
  (record headers, the record chain, batch boundaries, marker values,
  checksums past the last checkpoint), what recovery would cut, and the
  checkpoint's counters against a recount of the markers;
* with ``deep``: the checksum of every record.

Severities: REPAIRABLE problems are ones that recovery fixes by itself
without losing anything a flush confirmed (a torn tail, a damaged spare
checkpoint slot, stale counters); CORRUPT problems mean confirmed data is
damaged or missing. NOTE is for findings that are not damage.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import logging
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from .errors import CannotCheck, CorruptJournal, FormatError
from .header import HEADER_SIZE, SLOT_OFFSETS, SLOT_SIZE, Checkpoint, Identity, newest, read_checkpoints
from .journal import Journal
from .marker import Marker
from .record import RECORD_HEADER_SIZE

log = logging.getLogger(__name__)

#: Zero-filled byte ranges of the header (after each checkpoint slot, up to the next sector or the end).
HEADER_ZEROS = ((SLOT_OFFSETS[0] + SLOT_SIZE, SLOT_OFFSETS[1]), (SLOT_OFFSETS[1] + SLOT_SIZE, HEADER_SIZE))
#: errno values of the moment (not damage): a check that meets one stops the run (CannotCheck).
TRANSIENT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN, errno.EINTR})
#: Problems reported per file at most (the first ones; the rest are counted).
MAX_PER_FILE = 20


class Severity(enum.IntEnum):
    NOTE = 0  # not damage (an unknown file, a quarantined shard)
    REPAIRABLE = 1  # recovery or repair fixes it; nothing confirmed is lost
    CORRUPT = 2  # confirmed data is damaged or missing


@dataclasses.dataclass(frozen=True, slots=True)
class Problem:
    """One finding: where, how bad, what was expected and what was found."""

    path: str
    offset: int | None
    severity: Severity
    what: str  # a short stable code: "header", "torn_tail", "checksum", ...
    expected: str
    found: str
    length: int | None = None  # bytes from ``offset`` that repair zeroes (padding and slot findings)

    def as_dict(self) -> dict[str, object]:
        return {"path": self.path, "offset": self.offset, "length": self.length,
                "severity": self.severity.name.lower(), "what": self.what, "expected": self.expected,
                "found": self.found}


@dataclasses.dataclass(slots=True)
class JournalCheck:
    """The problems of one journal, and the journal opened read-only (or
    None if it could not be): owners read metadata and records from it and
    close it."""

    problems: list[Problem]
    journal: Journal | None
    bytes_read: int = 0

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()

    @property
    def durable_end(self) -> int:
        """End of the records the newest checkpoint declared durable."""
        if self.journal is None or self.journal.recovery is None:
            return self.journal.end if self.journal is not None else HEADER_SIZE
        return self.journal.recovery.checkpoint.end


def check_journal(path: Path, *, kind: bytes | None = None, deep: bool = False) -> JournalCheck:
    """Check one journal file (see the module docstring). Never raises for
    damage: it is reported. OSError (a missing file, no permission) passes."""
    where = str(path)
    try:
        header = read_regular(path, HEADER_SIZE)
        identity = Identity.decode(header, where)
    except FormatError as exc:
        return JournalCheck([Problem(where, exc.offset, Severity.CORRUPT, "header", "a valid journal header",
                                     exc.detail)], None, HEADER_SIZE)
    problems = _check_header(where, header, identity, kind)
    if problems and problems[0].what == "kind":
        return JournalCheck(problems, None, len(header))
    _, checkpoint = newest(read_checkpoints(header))
    if checkpoint.sealed and os.path.getsize(path) < checkpoint.end:  # cut short: no reader can open it
        check = JournalCheck(problems, None, len(header))
        _check_sealed_size(check, where, checkpoint)
        return check
    sealed_fast = checkpoint.sealed and not deep
    try:
        # a sealed file never shrinks again: mapped. An open one may be sealed (trimmed) by a live
        # writer at any moment, which would fault a mapping (SIGBUS): read it into memory
        # (a sealed file's stray tail, which a starting server may cut, is never read: limit)
        journal = Journal.open(path, writable=False, recount=not sealed_fast, snapshot=not checkpoint.sealed,
                               limit=checkpoint.end if checkpoint.sealed and deep else None)
    except CorruptJournal as exc:
        problems.append(Problem(where, exc.offset, Severity.CORRUPT, "records", "every record a flush confirmed",
                                exc.detail))
        return JournalCheck(problems, None, os.path.getsize(path))
    except FormatError as exc:
        problems.append(Problem(where, exc.offset, Severity.CORRUPT, "format", "a readable journal", exc.detail))
        return JournalCheck(problems, None, len(header))
    walked = journal.recovery.file_size if journal.recovery is not None else HEADER_SIZE
    check = JournalCheck(problems, journal, walked)
    if checkpoint.sealed:
        _check_sealed_size(check, where, checkpoint)
    if journal.recovery is not None:
        _check_recovery(check, where)
    if deep:
        check.bytes_read = max(check.bytes_read, _check_bodies(check, where))
    return check


def read_regular(path: Path, limit: int | None = None) -> bytes:
    """The first ``limit`` bytes (or all) of a regular file; FormatError for
    anything else in its place (a FIFO would block the run forever, a
    directory or device is not the file). OSError passes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FormatError(path, 0, "not a regular file (a directory, FIFO, socket or device in its place)")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit) if limit is not None else f.read()
    finally:
        os.close(fd)


def _check_header(where: str, header: bytes, identity: Identity, kind: bytes | None) -> list[Problem]:
    problems = []
    if kind is not None and identity.kind != kind:
        return [Problem(where, 12, Severity.CORRUPT, "kind", f"journal kind {kind!r}", f"{identity.kind!r}")]
    for start, stop in HEADER_ZEROS:
        nonzero = np.flatnonzero(np.frombuffer(header[start:stop], dtype=np.uint8))
        if len(nonzero):
            first = start + int(nonzero[0])
            problems.append(Problem(where, first, Severity.REPAIRABLE, "header_padding",
                                    "zero bytes between the checkpoint slots", f"{len(nonzero)} non-zero bytes",
                                    stop - first))
    for i, offset in enumerate(SLOT_OFFSETS):
        raw = header[offset:offset + SLOT_SIZE]
        if any(raw) and Checkpoint.decode(raw) is None:
            problems.append(Problem(where, offset, Severity.REPAIRABLE, "checkpoint_slot",
                                    f"checkpoint slot {i} empty or passing its checksum",
                                    "a damaged slot (a torn checkpoint write, or a flipped bit); "
                                    "recovery uses the other slot", SLOT_SIZE))
    return problems


def _check_sealed_size(check: JournalCheck, where: str, checkpoint: Checkpoint) -> None:
    size = os.path.getsize(where)
    if size < checkpoint.end:
        check.problems.append(Problem(where, size, Severity.CORRUPT, "sealed_size",
                                      f"{checkpoint.end} bytes (the sealed records)", f"{size} bytes"))
    elif size > checkpoint.end:
        check.problems.append(Problem(where, checkpoint.end, Severity.REPAIRABLE, "sealed_tail",
                                      f"{checkpoint.end} bytes (sealing trims the file)",
                                      f"{size - checkpoint.end} more bytes"))


def _check_recovery(check: JournalCheck, where: str) -> None:
    journal = check.journal
    assert journal is not None and journal.recovery is not None
    report = journal.recovery
    if not report.clean and not report.checkpoint.sealed:  # a sealed file's tail: _check_sealed_size
        dropped = f", {report.dropped_records} records of an unfinished batch" if report.dropped_records else ""
        check.problems.append(Problem(where, report.end, Severity.REPAIRABLE, "torn_tail",
                                      "records up to the end of the file, or zeros",
                                      f"the walk stopped at byte {report.stop_offset} ({report.stop_reason}){dropped}; "
                                      f"recovery cuts the file at byte {report.end}"))
    ckpt = report.checkpoint
    if ckpt.end == report.end and tuple(ckpt.counters) != tuple(report.counters):
        names = [m.name.lower() for m in Marker]
        check.problems.append(Problem(where, None, Severity.REPAIRABLE, "counters",
                                      f"checkpoint counters {dict(zip(names, ckpt.counters))}",
                                      f"markers recounted {dict(zip(names, report.counters))}; recovery recounts"))


def _check_bodies(check: JournalCheck, where: str) -> int:
    """Verify every record's checksum and zero padding; returns the bytes covered."""
    journal = check.journal
    assert journal is not None
    found, dirty, first_dirty = 0, 0, 0
    for chunk in journal.scan(window=16 << 20):
        padded = journal.dirty_padding(chunk)
        if len(padded) and not dirty:
            first_dirty = int(padded[0])
        dirty += len(padded)
        for offset in journal.bad_checksums(chunk).tolist():
            found += 1
            if found <= MAX_PER_FILE:
                check.problems.append(Problem(where, offset, Severity.CORRUPT, "checksum",
                                              "the record's crc32c (length, seq and body)",
                                              "different bytes: damaged since it was written"))
    if found > MAX_PER_FILE:
        check.problems.append(Problem(where, None, Severity.CORRUPT, "checksum", "the record's crc32c",
                                      f"{found - MAX_PER_FILE} more damaged records (the first {MAX_PER_FILE} "
                                      "are listed)"))
    if dirty:
        check.problems.append(Problem(where, first_dirty, Severity.REPAIRABLE, "record_padding",
                                      "zero bytes after each record, up to the alignment",
                                      f"non-zero padding after {dirty} records (outside the checksums: no data "
                                      "is affected); repair zeroes it"))
    return journal.end


def zero_record_padding(path: Path) -> int:
    """Offline repair: zero the padding of every record of a journal
    whose padding is not zero (durably). Returns how many records."""
    ranges: list[tuple[int, int]] = []
    with Journal.open(path, writable=False) as journal:
        for chunk in journal.scan(window=16 << 20):
            dirty = np.isin(chunk.offsets, journal.dirty_padding(chunk))
            starts = chunk.offsets + RECORD_HEADER_SIZE + chunk.lengths  # each record's padding
            ranges += zip(starts[dirty].tolist(), (chunk.ends(journal.alignment) - starts)[dirty].tolist())
    zero_ranges(path, ranges)
    return len(ranges)


def zero_ranges(path: Path, ranges: list[tuple[int, int]]) -> None:
    """Offline repair: write zeros over ``(offset, length)`` ranges, then fsync."""
    if not ranges:
        return
    fd = os.open(path, os.O_WRONLY)
    try:
        for offset, length in ranges:
            os.pwrite(fd, bytes(length), offset)
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclasses.dataclass(slots=True)
class Findings:
    """Everything a verify run found so far, and how much it read. Owners
    add to it; ``on_file(path, size)`` (optional) hears of each file done."""

    problems: list[Problem] = dataclasses.field(default_factory=list)
    files: int = 0
    bytes_read: int = 0
    on_file: Callable[[Path, int], None] | None = None

    def add(self, path: Path, severity: Severity, what: str, expected: str, found: str,
            offset: int | None = None, length: int | None = None) -> None:
        self.problems.append(Problem(str(path), offset, severity, what, expected, found, length))

    def unknown(self, path: Path, expected: str) -> None:
        """A file or directory nobody owns: reported, never touched."""
        self.add(path, Severity.NOTE, "unknown_file", expected, "a file this service did not write")

    def done(self, path: Path, bytes_read: int) -> None:
        """One more file checked."""
        self.files += 1
        self.bytes_read += bytes_read
        if self.on_file is not None:
            self.on_file(path, bytes_read)

    def read(self, nbytes: int) -> None:
        """More bytes read of a file already counted."""
        self.bytes_read += nbytes

    def journal(self, path: Path, kind: bytes, deep: bool, cap: Severity = Severity.CORRUPT) -> JournalCheck:
        """check_journal, its problems added here (no worse than ``cap``:
        derived files that are rebuilt are at most REPAIRABLE); the caller
        closes it. A file that vanished meanwhile (a live server collected
        it) is a NOTE; one that cannot be read (EIO) is CORRUPT (capped);
        PermissionError passes."""
        try:
            check = check_journal(path, kind=kind, deep=deep)
        except FileNotFoundError:
            self.add(path, Severity.NOTE, "vanished", "the file", "deleted during the run (a live server's collector)")
            return JournalCheck([], None)
        except PermissionError:
            raise
        except OSError as exc:
            if exc.errno in TRANSIENT_ERRNOS:
                raise CannotCheck(f"{path}: {exc.strerror}: a resource of the moment, not damage") from exc
            self.add(path, min(cap, Severity.CORRUPT), "unreadable", "a readable file", f"{exc.strerror or exc}")
            return JournalCheck([], None)
        self.problems += [p if p.severity <= cap else dataclasses.replace(p, severity=cap) for p in check.problems]
        self.done(path, check.bytes_read)
        return check

    @contextlib.contextmanager
    def guard(self, path: Path) -> Iterator[None]:
        """Around the check of one unit (a shard, a segment): damage no rule
        foresaw (an exception from a reader) is reported, not raised, so one
        bad unit cannot stop the run. PermissionError passes."""
        try:
            yield
        except (PermissionError, CannotCheck):
            raise
        except MemoryError as exc:
            raise CannotCheck(f"checking {path}: out of memory") from exc
        except FileNotFoundError as exc:
            self.add(Path(exc.filename or path), Severity.NOTE, "vanished", "the file",
                     "deleted during the run (a live server's collector)")
        except OSError as exc:
            if exc.errno in TRANSIENT_ERRNOS:
                raise CannotCheck(f"checking {path}: {exc.strerror}: a resource of the moment") from exc
            self.add(path, Severity.CORRUPT, "unreadable", "a readable file", f"{exc.strerror or exc}")
        except Exception as exc:  # a rule no check foresaw: reported, but repair moves nothing for it
            log.warning("verify: checking %s raised", path, exc_info=True)
            self.add(path, Severity.CORRUPT, "check_failed", "a unit every check can read",
                     f"{type(exc).__name__}: {exc}")

    def worst(self) -> Severity:
        return max((p.severity for p in self.problems), default=Severity.NOTE)
