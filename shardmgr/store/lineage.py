"""Lineage: where the rows of a rewritten shard came from, so that old refs keep working.

A shard rewritten from others (rewrite.py: dropping deleted rows, merging
small shards) holds, beside its vectors and ids, a third row file, ``refs``
(column ``REFS``, int64): the ref each row was appended under, strictly
ascending (inputs are taken in shard order, rows in order). Search returns
these refs, not (shard, row) of the rewritten shard, so a ref a caller holds
names the same vector before and after any number of rewrites, and the id of
a rewritten shard never appears in a ref.

Its journal's metadata adds to a shard's (shard.py)::

    sources   {original shard id: its row count}  every shard whose refs resolve here
    inputs    [shard ids]                         the shards it replaced: removed at
                                                  the next open if a crash left them
    refs_crc  crc32c of the refs rows

A ref (s, r) whose shard s is gone resolves through the shard whose sources
name s: to the row carrying that ref (a binary search of the refs column),
else to *deleted* when r < sources[s] (the row was deleted before a rewrite
dropped it), else to *unknown*.

So the rows of an original shard must live in one shard only: itself, or
the one rewritten shard whose sources name it. Two live shards claiming one
(``overlaps``: e.g. a shard directory restored from a snapshot into a data
directory whose own rewrite of the same rows went on) make its refs
ambiguous: a ref resolves to the newest claimant, and search returns such a
row once per claimant, deleted in one of them or not. Nothing the store
writes makes that; the store logs it at open and ``shardmgr verify``
reports it (``overlapping_sources``), but neither can tell which claimant
holds the right rows and deletes, so both stay served until an operator
moves the wrong one out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import crc32c
import numpy as np

from common.journal.errors import FormatError
from shardmgr.errors import UnknownRef

from . import layout
from .refs import ROW_BITS, ROW_MASK
from .rows import REFS, RowFile


@dataclasses.dataclass(frozen=True, slots=True)
class Lineage:
    """A rewritten shard's sources (original shard id -> its rows), inputs and refs checksum."""

    sources: dict[int, int]
    inputs: tuple[int, ...]
    refs_crc: int

    def encode(self) -> dict[str, Any]:
        return {"sources": [[s, n] for s, n in sorted(self.sources.items())], "inputs": list(self.inputs),
                "refs_crc": self.refs_crc}

    @classmethod
    def decode(cls, meta: Mapping[str, Any], path: Path) -> Lineage | None:
        """The lineage in a shard journal's metadata; None for a shard never rewritten."""
        if "sources" not in meta:
            return None
        try:
            sources = {int(s): int(n) for s, n in meta["sources"]}
            return cls(sources, tuple(int(i) for i in meta["inputs"]), int(meta["refs_crc"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(path, 0, f"lineage metadata {meta.get('sources')!r}: {exc}") from exc


def check_refs(refs: np.ndarray, lineage: Lineage, path: Path) -> None:
    """FormatError unless ``refs`` are strictly ascending, match the recorded
    checksum and each names a row of one of the sources."""
    if crc32c.crc32c(refs.data.cast("B")) != lineage.refs_crc:
        raise FormatError(path, 0, "the refs rows do not match the crc32c in the shard's journal")
    if len(refs) > 1 and not (np.diff(refs) > 0).all():
        raise FormatError(path, 0, "the refs are not strictly ascending")
    shards, rows = refs >> ROW_BITS, refs & ROW_MASK
    limits = np.array([lineage.sources.get(s, -1) for s in np.unique(shards).tolist()])
    if len(refs) and (rows >= limits[np.searchsorted(np.unique(shards), shards)]).any():
        raise FormatError(path, 0, "a ref names a row its source shard never had")


def open_refs(directory: Path, uid: bytes, rows: int, lineage: Lineage) -> RowFile:
    """The refs row file of a rewritten shard, checked (header, size, checksum, order)."""
    refs = RowFile.open(directory / layout.REFS, writable=False)
    try:
        header = refs.header
        if (header.column, header.dtype, header.width) != (REFS, "<i8", 1) or header.uuid != uid:
            raise FormatError(refs.path, 0, f"header {header} does not belong to this shard")
        if refs.rows_fitting() < rows:
            raise FormatError(refs.path, refs.size, f"{rows} rows need {rows * 8} bytes of refs")
        check_refs(refs.rows(rows), lineage, refs.path)
    except BaseException:
        refs.close()
        raise
    return refs


def overlaps(lineages: Mapping[int, Lineage | None]) -> dict[int, tuple[list[int], list[int]]]:
    """The live shards that claim rows of an original shard another live
    shard claims too: shard id -> (those original shards, the other
    claimants). ``lineages``: each shard present (id -> its lineage, None
    if never rewritten; a shard claims its sources, or itself). Shards are
    taken newest first, as the store opens them, and one named in the inputs
    of a newer live shard is not live (the next open removes it)."""
    superseded: set[int] = set()
    claims: dict[int, list[int]] = {}
    for shard_id in sorted(lineages, reverse=True):
        if shard_id in superseded:
            continue
        found = lineages[shard_id]
        for source in found.sources if found is not None else (shard_id,):
            claims.setdefault(source, []).append(shard_id)
        superseded.update(found.inputs if found is not None else ())
    twice: dict[int, tuple[set[int], set[int]]] = {}
    for source, claimants in claims.items():
        for shard_id in claimants if len(claimants) > 1 else ():
            sources, others = twice.setdefault(shard_id, (set(), set()))
            sources.add(source)
            others.update(c for c in claimants if c != shard_id)
    return {shard_id: (sorted(sources), sorted(others)) for shard_id, (sources, others) in sorted(twice.items())}


class Located(Protocol):
    """What :func:`locate` needs of a shard's published view (shard.View)."""

    @property
    def shard(self) -> int: ...

    @property
    def rows(self) -> int: ...

    @property
    def refs(self) -> np.ndarray | None: ...

    @property
    def lineage(self) -> Lineage | None: ...


def locate(refs: np.ndarray, views: Mapping[int, Located], moved: Mapping[int, int],
           collection: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(shard ids, rows, gone) of ``refs``: where each names a row now
    (``gone``: deleted before a rewrite dropped it; its shard and row are
    then -1). UnknownRef, naming the first, for a ref that names no row."""
    shards, rows = refs >> ROW_BITS, refs & ROW_MASK
    out_shards, out_rows = shards.copy(), rows.copy()
    gone = np.zeros(len(refs), dtype=bool)
    for shard_id in np.unique(shards).tolist():
        mine = np.flatnonzero(shards == shard_id)
        view = views.get(shard_id)
        if view is not None and view.refs is None:  # an original shard: the row is the ref's
            bad = (rows[mine] >= view.rows) | (refs[mine] < 0)
        elif shard_id in moved:  # rewritten: find the row that carries the ref
            target = views[moved[shard_id]]
            assert target.refs is not None and target.lineage is not None
            if target.rows:
                at = np.minimum(np.searchsorted(target.refs, refs[mine]), target.rows - 1)
                found = target.refs[at] == refs[mine]
            else:
                at, found = np.zeros(len(mine), np.int64), np.zeros(len(mine), bool)
            bad = ~found & (rows[mine] >= target.lineage.sources[shard_id])
            out_shards[mine], out_rows[mine] = np.where(found, target.shard, -1), np.where(found, at, -1)
            gone[mine] = ~found & ~bad
        else:
            bad = np.ones(len(mine), dtype=bool)
        if bad.any():
            raise UnknownRef(f"collection {collection!r}: ref {int(refs[mine][np.argmax(bad)])} names no stored row")
    return out_shards, out_rows, gone
