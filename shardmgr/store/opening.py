"""Opening a collection's shards from its directory at start-up (Collection.open).

What a crash or a failed check left is settled here, before anything is
served: a shard creation or rewrite cut short (``<id>.tmp``) is removed; a
shard a committed rewrite replaced (named by the rewritten shard's lineage)
is removed; a shard that fails its checks is moved to ``quarantine/`` with
the reason (quarantine.py), never deleted; shards whose lineages claim the
same rows are logged (``shardmgr verify`` reports them). Every id seen, on
disk or in quarantine, counts towards the next shard id: ids are never
reused, so a ref stays valid for the life of its data.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path

from common.journal import Flusher
from common.journal.filesystem import fsync_dir

from . import index as indexes
from . import layout, lineage
from .config import StoreConfig
from .quarantine import quarantine, quarantine_reason
from .shard import Shard
from .shard_files import ShardDamaged

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Opened:
    """A collection's shards as opened: by id (ascending), what is in quarantine, and the next id to use."""

    shards: dict[int, Shard]
    quarantined: list[str]  # "<directory>: <reason>"
    next_shard: int


def open_shards(directory: Path, name: str, dim: int, index: str, flusher: Flusher, config: StoreConfig) -> Opened:
    """Open every shard of the collection ``name`` in ``directory`` (module
    docstring). An error that is not damage (too many open files, say)
    closes what was opened, moves nothing more, and is raised."""
    moved = sorted(p for p in (directory / layout.QUARANTINE).iterdir() if p.is_dir()) \
        if (directory / layout.QUARANTINE).exists() else []
    seen = [int(p.name.split("-")[0]) for p in moved]
    quarantined = [f"{p.name}: {quarantine_reason(p)}" for p in moved]
    for path in directory.glob(f"*{layout.TMP_SUFFIX}"):  # a creation or rewrite a crash cut short
        if path.is_dir() and path.name[:-len(layout.TMP_SUFFIX)].isdigit():  # not collection.tmp, say
            seen.append(int(path.name[:-len(layout.TMP_SUFFIX)]))
            shutil.rmtree(path)
    # newest first: a rewritten shard's id is above its inputs', so its lineage names the inputs a
    # crash left behind (between the rewrite's commit and their removal) before they come up
    shards: dict[int, Shard] = {}
    superseded: set[int] = set()
    for path in sorted((p for p in directory.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: -int(p.name)):
        shard_id = int(path.name)
        seen.append(shard_id)
        if shard_id in superseded:
            log.info("collection %s: removing shard %d, replaced by a rewrite", name, shard_id)
            shutil.rmtree(path)
            fsync_dir(directory)
            continue
        try:
            shard = Shard.open(path, shard_id, dim, flusher, config.extent_bytes)
        except ShardDamaged as exc:
            target = quarantine(path, exc.reason)
            quarantined.append(f"{target.name}: {exc.reason}")
            log.error("collection %s: shard %s quarantined to %s: %s", name, path.name, target, exc.reason)
            continue
        except BaseException:  # not damage (e.g. too many open files): nothing moves, nothing stays open
            for opened in shards.values():
                opened.close()
            raise
        shards[shard_id] = shard
        superseded.update(shard.lineage.inputs if shard.lineage is not None else ())
        if index != indexes.EXACT:
            shard.index = indexes.load(path, shard.rows, index, shard.uuid)
    for shard_id, (sources, others) in lineage.overlaps({i: s.lineage for i, s in shards.items()}).items():
        log.error("collection %s: shard %d holds rows of shards %s that shards %s hold too: their refs are "
                  "ambiguous (shardmgr verify: overlapping_sources)", name, shard_id, sources, others)
    return Opened(dict(sorted(shards.items())), quarantined, max(seen, default=0) + 1)
