"""Rewriting sealed shards: deleted rows dropped, small shards merged, refs kept.

Which (``plan``, the store's maintenance thread, one rewrite at a time):

* a sealed shard whose live rows are fewer than ``rewrite_live_fraction``
  of its rows is rewritten with its live rows only;
* else consecutive sealed shards whose live vectors are each smaller than
  ``merge_below_fraction`` × ``seal_bytes`` (short sessions, idle seals)
  are merged, as many as fit in ``seal_bytes``.

The new shard carries each row's ref (lineage.py), so refs handed out before
stay valid and never name another vector. Steps, and what a crash at each
leaves (the next open finishes or undoes it; tests/shardmgr/store/test_rewrite.py):

1. *plan*, under the write lock: the inputs, a snapshot of each (its view:
   rows and deleted mask) and a fresh shard id;
2. *build*, off the lock, into ``<id>.tmp/``: the live rows' vectors, ids
   and refs, and a journal (one batch record per chunk, the lineage in its
   metadata), sealed: every file synced. A crash leaves the ``.tmp``
   directory, removed at the next open (as a creation cut short); the
   inputs are untouched and still serve;
3. *publish*, under the write lock: rows deleted from the inputs since the
   snapshot are deleted in the new shard too (its delete log, made durable),
   then the directory is renamed into place and the collection directory
   synced: the commit point. After it, the next open (newest shards first)
   removes the inputs the new shard names instead of opening them;
4. the inputs leave the shard list (readers holding their views keep reading
   their mappings) and their files are closed and removed.

Threads: plan and publish under the store's write lock, build on the
maintenance thread with no lock (inputs are sealed: their rows never change;
their deletes are caught up in step 3).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path

import crc32c
import msgpack
import numpy as np

from common.journal import Flusher, Journal
from common.journal.filesystem import fsync_dir, make_dirs

from . import batch_record, layout
from .batch_record import JOURNAL_KIND, VERSION, VERSION_KEY
from .config import StoreConfig
from .deletes import DeleteLog, over
from .lineage import Lineage
from .rows import IDS, REFS, VECTORS, RowFile, RowHeader
from .shard import Shard
from .shard_files import JOURNAL_CONFIG
from .view import View

log = logging.getLogger(__name__)

CHUNK_ROWS = 65536
"""Rows copied per write and per batch record while building."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """One rewrite: its inputs as they were when planned, and the new shard's id."""

    shard_id: int
    inputs: tuple[View, ...]

    @property
    def live(self) -> list[np.ndarray]:
        """Each input's live rows at plan time."""
        return [np.flatnonzero(~v.dead()) for v in self.inputs]


def plan(shards: list[Shard], config: StoreConfig, dim: int) -> list[Shard]:
    """The sealed shards to rewrite next, in id order (empty: nothing to do)."""
    sealed = [s for s in sorted(shards, key=lambda s: s.id) if s.sealed]
    for shard in sealed:
        if shard.rows and shard.rows - shard.deletes.count < config.rewrite_live_fraction * shard.rows:
            return [shard]
    small = config.merge_below_fraction * config.seal_bytes
    run: list[Shard] = []
    run_bytes = 0
    for shard in sealed:
        size = (shard.rows - shard.deletes.count) * dim * 4
        if size < small and run_bytes + size <= config.seal_bytes:
            run.append(shard)
            run_bytes += size
            continue
        if len(run) >= 2:
            return run
        run, run_bytes = ([shard], size) if size < small else ([], 0)
    return run if len(run) >= 2 else []


@dataclasses.dataclass(frozen=True)
class Built:
    """A rewritten shard, built and synced under its ``.tmp`` name."""

    path: Path
    uuid: bytes
    rows: int
    placed: np.ndarray  # the new row of each input live row (the inputs' live rows concatenated)


def build(directory: Path, plan_: Plan, dim: int, collection: str, flusher: Flusher) -> Built:
    """Write the new shard into ``<directory>/<id>.tmp`` (synced, sealed)."""
    building = directory / f"{plan_.shard_id:08d}{layout.TMP_SUFFIX}"
    try:
        return _build(building, plan_, dim, collection, flusher)
    except BaseException:  # e.g. a full disk: the inputs still serve; nothing of the attempt stays
        shutil.rmtree(building, ignore_errors=True)
        raise


def _build(building: Path, plan_: Plan, dim: int, collection: str, flusher: Flusher) -> Built:
    make_dirs(building)
    uid = uuidlib.uuid4().bytes
    live = plan_.live
    refs = np.concatenate([v.refs_at(rows) for v, rows in zip(plan_.inputs, live)] or [np.zeros(0, np.int64)])
    # rows go in ref order (refs must ascend: lineage.py); a rewritten input's refs can
    # precede an older input's, so the inputs' rows interleave
    order = np.argsort(refs, kind="stable")
    refs = refs[order]
    sources: dict[int, int] = {}
    for view in plan_.inputs:
        sources.update(view.lineage.sources if view.lineage is not None else {view.shard: view.rows})
    lineage = Lineage(sources, tuple(v.shard for v in plan_.inputs), crc32c.crc32c(refs.data.cast("B")))
    meta = msgpack.packb({"collection": collection, "shard": plan_.shard_id, "dim": dim, "uuid": uid,
                          VERSION_KEY: VERSION, **lineage.encode()})
    columns = [RowFile.create(building / name, RowHeader(column, dtype, width, uid))
               for name, column, dtype, width in ((layout.VECTORS, VECTORS, "<f4", dim), (layout.IDS, IDS, "<i8", 1),
                                                  (layout.REFS, REFS, "<i8", 1))]
    try:
        Journal.write_empty(building / layout.JOURNAL, kind=JOURNAL_KIND, metadata=meta, config=JOURNAL_CONFIG)
        with Journal.open(building / layout.JOURNAL, kind=JOURNAL_KIND, flusher=flusher,
                          config=JOURNAL_CONFIG) as journal:
            for column in columns:
                journal.add_companion(column.fd)
            first = 0
            for vectors, ids in _chunks(plan_.inputs, live, order, dim):
                columns[0].write(first, vectors)
                columns[1].write(first, ids)
                journal.append(batch_record.pack(first, vectors, ids))
                first += len(ids)
            columns[2].write(0, refs)
            for column in columns:
                column.truncate(len(refs))
            journal.seal()  # syncs the row files (its companions) with it
    finally:
        for column in columns:
            column.close()
    fsync_dir(building)
    placed = np.empty(len(order), np.int64)
    placed[order] = np.arange(len(order))
    return Built(building, uid, len(refs), placed)


def publish(built: Built, plan_: Plan, current: list[Shard], flusher: Flusher) -> Path:
    """Carry over deletes made since the plan, then rename the new shard into
    place (the commit point); returns its directory. Caller holds the write lock."""
    caught_up = np.sort(built.placed[_deleted_since(plan_, current)])
    try:
        if len(caught_up):
            deletes = DeleteLog(built.path, plan_.shard_id, built.uuid, flusher, None, np.zeros(0, dtype=bool))
            try:
                _, ticket = deletes.add(caught_up, built.rows)
                assert ticket is not None
                ticket.journal.flush()
            finally:
                deletes.close()
            fsync_dir(built.path)
    except BaseException:  # not committed: the inputs still serve, and nothing of the attempt stays
        shutil.rmtree(built.path, ignore_errors=True)
        raise
    final = built.path.with_name(built.path.name[:-len(layout.TMP_SUFFIX)])
    os.rename(built.path, final)
    fsync_dir(final.parent)
    return final


def remove(inputs: list[Shard]) -> None:
    """Close and delete the inputs a published rewrite replaced."""
    for shard in inputs:
        shard.close()
        shutil.rmtree(shard.directory, ignore_errors=True)
    if inputs:
        fsync_dir(inputs[0].directory.parent)


def _deleted_since(plan_: Plan, current: list[Shard]) -> np.ndarray:
    """Positions (in the inputs' live rows, concatenated) of rows deleted after the plan's snapshot."""
    found, base = [], 0
    for view, shard, live in zip(plan_.inputs, current, plan_.live):
        now = over(shard.deletes.mask, view.rows)
        found.append(base + np.flatnonzero(now[live]))
        base += len(live)
    return np.concatenate(found) if found else np.zeros(0, np.int64)


def _chunks(inputs: tuple[View, ...], live: list[np.ndarray], order: np.ndarray,
            dim: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(vectors, ids) of the live rows in ``order`` (positions in the inputs'
    live rows, concatenated), CHUNK_ROWS at a time."""
    which = np.concatenate([np.full(len(rows), i) for i, rows in enumerate(live)] or [np.zeros(0, np.int64)])
    rows = np.concatenate(live or [np.zeros(0, np.int64)])
    for start in range(0, len(order), CHUNK_ROWS):
        part = order[start:start + CHUNK_ROWS]
        vectors, ids = np.empty((len(part), dim), np.float32), np.empty(len(part), np.int64)
        for i in np.unique(which[part]).tolist():
            mine = which[part] == i
            vectors[mine] = inputs[i].vectors[rows[part][mine]]
            ids[mine] = inputs[i].ids[rows[part][mine]]
        yield vectors, ids
