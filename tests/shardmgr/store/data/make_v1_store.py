"""Make v1_store.tar.gz: a data directory written by the store as it was
before batch records carried the ids (version 1 records: 24 bytes, the ids
file authoritative). tests/shardmgr/store/test_v1_shards.py opens it.

Run with a checkout of that version first on the path (it was made from
commit 95f7e00)::

    PYTHONPATH=/path/to/checkout-at-95f7e00 python make_v1_store.py OUT.tar.gz

Contents, every vector ``rows_of(n, dim, seed)`` and ids as listed:

* collection ``old`` (dim 8, l2; seal_bytes 4096 = 128 rows): shard 1
  sealed with batches of 100 and 28 rows (ids 0..127, seeds 1 and 2), rows
  5 and 77 deleted (durably); shard 2 mid-build, left as a crash leaves it
  (no clean close), with batches of 20 and 30 rows (ids 1000.., seeds 3 and
  4), all durable;
* collection ``closed`` (dim 4, l2): one growing shard closed cleanly (its
  clean-close marker present) holding 10 rows (ids 500.., seed 5).
"""

from __future__ import annotations

import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

import shardmgr


def rows_of(n: int, dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def main(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        store = shardmgr.open(data, seal_bytes=4096, extent_bytes=65536)
        store.create_collection("old", 8)
        first = store.append("old", rows_of(100, 8, 1), np.arange(100), durable=True)
        store.append("old", rows_of(28, 8, 2), np.arange(100, 128), durable=True)
        store.delete("old", first[[5, 77]], durable=True)
        store.append("old", rows_of(20, 8, 3), np.arange(1000, 1020), durable=True)  # seals shard 1
        store.append("old", rows_of(30, 8, 4), np.arange(1020, 1050), durable=True)
        store.create_collection("closed", 4)
        store.append("closed", rows_of(10, 4, 5), np.arange(500, 510), durable=True)
        store.close()
        # shard 2 of "old" as a crash leaves it: no clean-close marker
        (data / "shards" / "old" / "00000002" / "closed").unlink()
        (data / "LOCK").unlink(missing_ok=True)
        with tarfile.open(out, "w:gz") as tar:
            tar.add(data, arcname="data")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
