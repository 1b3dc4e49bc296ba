"""``get`` by ref from any node of a cluster (shardmgr/cluster/lookup.py):
rows of published shards wherever they are served, rows of the writer's
growing shard from the writer, the single store's errors for unknown and
deleted refs, and a retryable error naming the shard when no live node
serves it."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("boto3")
pytest.importorskip("etcd3gw")

from shardmgr.cluster.errors import ShardsUnavailable  # noqa: E402
from shardmgr.errors import UnknownRef  # noqa: E402
from shardmgr.store.client import StoreClient  # noqa: E402
from tests.shardmgr.cluster.nodes import batches, search  # noqa: E402
from tests.shardmgr.server.serverproc import ServerProcess  # noqa: E402


def test_rows_by_ref_from_every_node(three_nodes: list[ServerProcess]) -> None:
    n1, n2, n3 = three_nodes
    rows = list(batches(9, seed=11))
    vectors, ids = np.concatenate([v for v, _ in rows]), np.concatenate([i for _, i in rows])
    refs = search(n1.address, vectors, k=1).refs[:, 0]  # each row's own ref: 5 shards, the last growing
    assert len(np.unique(refs >> 40)) == 5
    for proc in three_nodes:
        with StoreClient(proc.address) as client:
            np.testing.assert_array_equal(client.get("docs", refs), vectors)
            np.testing.assert_array_equal(client.ids("docs", refs[::7]), ids[::7])
            with pytest.raises(UnknownRef):
                client.get("docs", [int(refs[0]) + 10_000])  # past its shard's end
            with pytest.raises(UnknownRef):
                client.get("docs", [99 << 40])  # a shard nobody has
    n1.kill()  # the writer: its growing shard (5) is on no other node
    with StoreClient(n2.address) as client, pytest.raises(ShardsUnavailable, match="shard"):
        client.get("docs", refs[-1:])
