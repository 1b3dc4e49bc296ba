"""``verify --repair``: what recovery would do, offline, plus quarantine.

Holds the data directory's lock for the whole run (a server cannot start
meanwhile, and a repair refuses to run while one holds it). Never deletes
data. In order:

1. every unit with a CORRUPT finding is moved aside: a shard (any file of
   it) to its collection's ``quarantine/`` (as the server does when a shard
   fails its checks on open); a collection whose metadata is unusable to
   ``DATA/quarantine/shards/``; a queue segment, completion-log segment or
   a damaged catalog to ``DATA/quarantine/workq/``;
2. queue files now gone (moved aside, or lost) are marked BURIED in the
   catalog: the loss is acknowledged, not forgotten;
3. bytes outside every checksum that must be zero are zeroed (padding,
   damaged checkpoint slots), and bytes past what recovery keeps are cut
   (sealed and torn tails); a sealed shard's ids file that differs from the
   ids its batch records carry is rewritten from them (version 2 shards);
4. the queue's and the store's own recovery runs (counters recounted,
   interrupted completions and collections finished, mid-build shards
   sealed, a lost catalog rebuilt, damaged indexes rebuilt).

Repairs use the default configuration of each component: recovery does not
depend on segment or seal sizes.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from common.journal import Flusher, FlusherConfig, Marker
from common.journal.check import Problem, Severity, zero_ranges, zero_record_padding
from common.journal.filesystem import fsync_dir, make_dirs
from common.journal.lockfile import DirectoryLocked, IncompleteCopy, LockFile
from shardmgr.errors import CannotVerify
from shardmgr.store.quarantine import quarantine
from shardmgr.store.replay import repair_ids
from shardmgr.store.store import Store
from workq.broker import Broker
from workq.disk.catalog import FILE as CATALOG_FILE
from workq.disk.catalog import Catalog, Entry
from workq.disk.records import QUARANTINE_DIR, quarantine_name

from . import lineage_checks

log = logging.getLogger(__name__)


class Repair:
    """Use as ``with Repair(root) as fixer: fixer.run(problems)``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = LockFile(root)

    def __enter__(self) -> Repair:
        try:
            self._lock.acquire()
        except DirectoryLocked as exc:
            raise CannotVerify(f"--repair needs the directory to itself: {exc}") from None
        except IncompleteCopy as exc:  # what is missing is only in the snapshot's source
            raise CannotVerify(f"--repair cannot complete a snapshot: {exc}") from None
        except OSError as exc:  # cannot create the lock file: read-only, no permission
            raise CannotVerify(f"--repair cannot lock {self.root}: {exc.strerror or exc}") from exc
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def run(self, problems: list[Problem]) -> list[str]:
        """Quarantine what is corrupt, then recover; returns what was done."""
        corrupt = [p for p in problems if p.severity == Severity.CORRUPT]
        actions = self._quarantine(corrupt)
        actions += self._bury(corrupt)
        repairable = [p for p in problems if p.severity == Severity.REPAIRABLE and Path(p.path).exists()]
        actions += self._zero(repairable)
        actions += self._cut_tails([p for p in repairable if p.what in ("rows_tail", "sealed_tail", "torn_tail")])
        actions += self._rewrite_ids([p for p in repairable if p.what == "ids_mismatch"])
        actions += self._recover()
        return actions

    def _zero(self, problems: list[Problem]) -> list[str]:
        """Bytes outside every checksum that must be zero: zero them."""
        ranges: dict[Path, list[tuple[int, int]]] = {}
        for p in problems:
            if p.length is not None and p.offset is not None:
                ranges.setdefault(Path(p.path), []).append((p.offset, p.length))
        actions = []
        for path, spans in sorted(ranges.items()):
            zero_ranges(path, spans)
            actions.append(f"zeroed {sum(n for _, n in spans)} bytes of {path.relative_to(self.root)} "
                           f"(padding or a damaged checkpoint slot)")
        for path in sorted({Path(p.path) for p in problems if p.what == "record_padding"}):
            actions.append(f"zeroed the padding of {zero_record_padding(path)} records of "
                           f"{path.relative_to(self.root)}")
        return actions

    def _quarantine(self, corrupt: list[Problem]) -> list[str]:
        units: dict[Path, str] = {}
        for problem in corrupt:
            if problem.what == "check_failed":  # no rule says this unit is damaged: never moved for it
                continue
            if problem.what == lineage_checks.OVERLAP:  # which claimant is wrong, nothing on disk says
                continue
            unit = self._unit(Path(problem.path))
            if unit is not None:
                units.setdefault(unit, f"{problem.what} at byte {problem.offset}: expected {problem.expected}, "
                                       f"found {problem.found}")
        actions = []
        for unit, reason in sorted(units.items()):
            if not unit.exists():
                continue
            target = quarantine(unit, reason) if self._is_shard(unit) else self._move_aside(unit)
            actions.append(f"moved {unit.relative_to(self.root)} to {target.relative_to(self.root)} ({reason})")
        return actions

    def _unit(self, path: Path) -> Path | None:
        """The directory or file to move aside for damage at ``path``."""
        parts = path.relative_to(self.root).parts
        if parts[:1] == ("shards",) and len(parts) >= 2:
            collection = self.root / "shards" / parts[1]
            if len(parts) >= 3 and parts[2].isdigit():
                return collection / parts[2]  # a shard
            return collection  # its metadata: the whole collection
        if parts[:1] == ("workq",) and len(parts) >= 2 and path.is_file():
            return path  # a segment, a completion-log segment, the catalog
        return None

    def _bury(self, corrupt: list[Problem]) -> list[str]:
        """Queue files now gone (lost, or just moved aside): mark their
        catalog records BURIED, so the loss is acknowledged, not forgotten."""
        queue = self.root / "workq"
        gone = sorted({e for p in corrupt if Path(p.path).is_relative_to(queue) and not Path(p.path).exists()
                       and (e := Entry.of(queue, Path(p.path))) is not None})
        if not gone or not (queue / CATALOG_FILE).exists():
            return []
        with Flusher(FlusherConfig()) as flusher:
            book = Catalog.open(queue, flusher)
            try:
                if book.mark(gone, Marker.BURIED) is not None:
                    book.journal.flush()
            finally:
                book.close()
        return [f"marked {len(gone)} queue files lost in the catalog: "
                f"{', '.join(str(e.path(queue).relative_to(self.root)) for e in gone)}"]

    def _is_shard(self, unit: Path) -> bool:
        return unit.parent.parent == self.root / "shards" and unit.name.isdigit()

    def _move_aside(self, unit: Path) -> Path:
        """A queue file or a whole collection to ``DATA/quarantine/<workq|shards>/``."""
        relative = unit.relative_to(self.root)
        target = self.root / QUARANTINE_DIR / relative.parts[0] / quarantine_name(
            Path(*relative.parts[1:]), time.strftime('%Y%m%dT%H%M%S'))
        make_dirs(target.parent)
        os.rename(unit, target)
        fsync_dir(unit.parent)
        fsync_dir(target.parent)
        return target

    def _cut_tails(self, tails: list[Problem]) -> list[str]:
        """Bytes past what recovery keeps (a sealed file's end, a torn tail): cut them, as recovery does."""
        actions = []
        for problem in tails:
            path = Path(problem.path)
            if path.exists() and problem.offset is not None and path.stat().st_size > problem.offset:
                os.truncate(path, problem.offset)
                with open(path, "rb+") as f:
                    os.fsync(f.fileno())
                actions.append(f"cut {path.relative_to(self.root)} to its {problem.offset} sealed bytes")
        return actions

    def _rewrite_ids(self, problems: list[Problem]) -> list[str]:
        """Sealed shards whose ids file differs from the ids in their batch
        records (version 2: the records are authoritative): rewrite it from
        them. Growing shards are left to the store's recovery, which does it."""
        actions = []
        for shard in sorted({Path(p.path).parent for p in problems}):
            rows = repair_ids(shard)
            if rows is not None:
                actions.append(f"rewrote {rows} ids of {shard.relative_to(self.root)} from its journal")
        return actions

    def _recover(self) -> list[str]:
        actions = []
        if (self.root / "workq").is_dir():
            try:
                broker = Broker(self.root, lock=False).open()
                broker.tick()  # collect finished segments now
                broker.close()
                actions.append("ran the work queue's recovery")
            except Exception as exc:  # reported; the second check shows what is left
                log.exception("repair: the work queue's recovery failed")
                actions.append(f"the work queue's recovery failed: {exc}")
        if (self.root / "shards").is_dir():
            try:
                with Store(self.root, lock=False).open() as store:
                    store.wait_for_indexes()  # damaged or missing indexes are rebuilt
                actions.append("ran the vector store's recovery")
            except Exception as exc:
                log.exception("repair: the vector store's recovery failed")
                actions.append(f"the vector store's recovery failed: {exc}")
        return actions
