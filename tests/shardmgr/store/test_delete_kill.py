"""SIGKILL a real server, many times, while a client appends and deletes durably.

Appends, deletes by ref and deletes by id all ask for durable=True. After
all the kills and restarts:

* every confirmed delete holds: get answers RowDeleted, and a search with
  the deleted row's own vector as the query does not return it;
* every confirmed append that no delete may have touched comes back with
  its exact vector and id, and is its own nearest neighbour;
* the counts of collection_info lie between what was confirmed and what
  may have been applied.

A call cut off by a kill (Unavailable) has an unknown outcome: the rows of
a cut-off append are never named again, and the refs a cut-off delete
named are left out of both checks (unless a later confirmed delete named
them). Each confirmed delete's count is checked against the rows it could
have found live.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest

import shardmgr
from common.journal.check import Severity
from common.wire.errors import Unavailable
from shardmgr.errors import RowDeleted
from shardmgr.store.client import StoreClient
from tests.shardmgr.server.serverproc import RepeatedKills, ServerProcess

DIM = 8
CHUNK = 200_000  # refs per get: within the per-call row limit


@dataclasses.dataclass
class Tracker:
    """What the client was told, and what it may have caused without being told."""

    rows: dict[int, tuple[np.ndarray, int]] = dataclasses.field(default_factory=dict)  # confirmed appends
    refs_of_id: dict[int, list[int]] = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    unconfirmed: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)  # id -> rows
    deleted: set[int] = dataclasses.field(default_factory=set)  # a confirmed delete named them
    maybe: set[int] = dataclasses.field(default_factory=set)  # only a cut-off delete named them
    deletes: int = 0
    id_deletes: int = 0

    def appended(self, refs: np.ndarray, vectors: np.ndarray, ids: np.ndarray) -> None:
        for ref, vector, id_ in zip(refs.tolist(), vectors, ids.tolist()):
            self.rows[ref] = (vector, id_)
            self.refs_of_id[id_].append(ref)

    def bounds(self, refs: set[int]) -> tuple[int, int]:
        """(fewest, most) of ``refs`` a delete can find live now."""
        sure = refs - self.deleted - self.maybe
        return len(sure), len(sure) + len((refs & self.maybe) - self.deleted)

    def confirm(self, refs: set[int]) -> None:
        self.deleted |= refs
        self.maybe -= refs

    def cut_off(self, refs: set[int]) -> None:
        self.maybe |= refs - self.deleted


def rewrites(server: ServerProcess) -> int:
    """Shard rewrites the server logged so far, in all its lives (compact's and the maintenance thread's)."""
    return sum("rewritten into" in line for line in server.log)


def run_kills(tmp_path: Path, seconds: float, seed: int) -> None:
    """Appends and deletes under kills for ``seconds``, and then on until what
    the run must show has happened (two kills, deletes of both kinds, a
    rewrite), for at most 120 s more: a loaded machine gets through fewer steps."""
    rng = random.Random(seed)
    config = tmp_path / "server.toml"
    # 512 rows a shard; rewrite a shard once 5 % of it is deleted, merge the small ones the kills seal
    config.write_text("[store]\nseal_bytes = 16384\nextent_bytes = 65536\nrewrite_live_fraction = 0.95\n"
                      "merge_below_fraction = 0.5\n")
    server = ServerProcess(tmp_path / "data", "--config", str(config)).start()
    try:
        client = shardmgr.connect(server.address, retry_for=60.0, timeout=30.0)
        client.create_collection("c", DIM, "l2")
        seen = Tracker()
        ops = random.Random(seed + 1)  # the killer thread has its own
        started = time.monotonic()
        step = 0
        with RepeatedKills(server, rng) as kills:

            def done() -> bool:
                ran = time.monotonic() - started
                if ran < seconds:
                    return False
                return ran >= seconds + 120 or bool(kills.count >= 2 and seen.deletes and seen.id_deletes
                                                    and rewrites(server))

            while not done():
                step += 1
                choice = ops.random()
                if choice < 0.5 or not seen.rows:
                    append_some(client, seen, ops, step)
                elif choice < 0.55:  # rewrite now, so that kills land in rewrites too
                    with contextlib.suppress(Unavailable):
                        client.compact("c")
                elif choice < 0.8:
                    delete_some(client, seen, ops)
                else:
                    delete_some_ids(client, seen, ops)
        assert kills.count >= 2 and seen.deletes and seen.id_deletes and rewrites(server), \
            (kills.count, seen.deletes, seen.id_deletes, rewrites(server))
        check(client, seen, seed)
        client.close()
        server.signal(signal.SIGKILL)  # one last kill: what it leaves is only for recovery to repair
        server.wait()
        report = shardmgr.verify(tmp_path / "data", deep=True)
        assert report.exit_code <= 1, [p for p in report.problems if p.severity == Severity.CORRUPT]
    finally:
        server.kill()


def append_some(client: StoreClient, seen: Tracker, ops: random.Random, step: int) -> None:
    """Append 1..60 rows durably, two rows an id (delete_ids takes both)."""
    n = ops.randint(1, 60)
    vectors = np.random.default_rng(step).standard_normal((n, DIM)).astype(np.float32)
    ids = step * 1000 + np.arange(n) // 2
    try:
        refs = client.append("c", vectors, ids, durable=True)
    except Unavailable:
        seen.unconfirmed.update(ids.tolist())  # may be stored; its refs are unknown
        return
    seen.appended(refs, vectors, ids)


def delete_some(client: StoreClient, seen: Tracker, ops: random.Random) -> None:
    """Delete 1..20 appended refs durably (some deleted already); the count must fit what could be live."""
    known = list(seen.rows)
    named = ops.sample(known, min(len(known), ops.randint(1, 20)))
    if seen.deleted and ops.random() < 0.3:  # some deleted already
        named += ops.sample(sorted(seen.deleted), min(len(seen.deleted), 3))
    low, high = seen.bounds(set(named))
    try:
        count = client.delete("c", np.array(named, dtype=np.int64), durable=True)
    except Unavailable:
        seen.cut_off(set(named))
        return
    assert low <= count <= high, f"delete of {len(named)} refs: {count} deleted, expected {low}..{high}"
    seen.confirm(set(named))
    seen.deletes += 1


def delete_some_ids(client: StoreClient, seen: Tracker, ops: random.Random) -> None:
    """Delete by 1..5 known ids, one id whose append was cut off and one no row carries; the count must fit."""
    wanted = ops.sample(sorted(seen.refs_of_id), min(len(seen.refs_of_id), ops.randint(1, 5)))
    wanted += ops.sample(sorted(seen.unconfirmed), min(len(seen.unconfirmed), 1))
    wanted.append(-1)  # an id no row carries
    carriers = {r for i in wanted for r in seen.refs_of_id.get(i, [])}
    low, high = seen.bounds(carriers)
    high += sum(seen.unconfirmed[i] for i in wanted)
    try:
        count = client.delete_ids("c", np.array(wanted, dtype=np.int64), durable=True)
    except Unavailable:
        seen.cut_off(carriers)
        return
    assert low <= count <= high, f"delete_ids {wanted}: {count} deleted, expected {low}..{high}"
    seen.confirm(carriers)
    seen.id_deletes += 1


def check(client: StoreClient, seen: Tracker, seed: int) -> None:
    """Every confirmed delete holds; every untouched confirmed append is intact; the counts fit."""
    sample = np.random.default_rng(seed)
    kept = np.array(sorted(set(seen.rows) - seen.deleted - seen.maybe), dtype=np.int64)
    assert len(kept)
    vectors = np.stack([seen.rows[int(r)][0] for r in kept])
    for start in range(0, len(kept), CHUNK):
        part = slice(start, start + CHUNK)
        np.testing.assert_array_equal(client.get("c", kept[part]), vectors[part])
        np.testing.assert_array_equal(client.ids("c", kept[part]), [seen.rows[int(r)][1] for r in kept[part]])
    some = sample.choice(len(kept), size=min(len(kept), 5000), replace=False)
    _, _, nearest = client.search("c", vectors[some], k=1)
    assert (nearest[:, 0] == kept[some]).all(), "a kept row is not its own nearest neighbour"

    gone = np.array(sorted(seen.deleted), dtype=np.int64)
    for ref in gone.tolist():
        with pytest.raises(RowDeleted):
            client.get("c", [ref])
    some = sample.choice(len(gone), size=min(len(gone), 5000), replace=False)
    _, _, found = client.search("c", np.stack([seen.rows[int(r)][0] for r in gone[some]]), k=3)
    back = set(found.ravel().tolist()) & seen.deleted
    assert not back, f"search returned {len(back)} deleted rows, e.g. {sorted(back)[:5]}"

    info = client.collection_info("c")  # rewrites drop deleted rows: only the live count is bounded both ways
    assert len(kept) <= info["rows"] <= len(seen.rows) - len(seen.deleted) + sum(seen.unconfirmed.values()), info


def test_sigkill_during_durable_deletes(tmp_path: Path) -> None:
    run_kills(tmp_path, seconds=4.0, seed=1)  # a kill every 0.2-0.7 s (the soak: 120 s)


@pytest.mark.soak
@pytest.mark.timeout(1800)
def test_sigkill_during_durable_deletes_soak(tmp_path: Path) -> None:
    run_kills(tmp_path, seconds=120.0, seed=2)
