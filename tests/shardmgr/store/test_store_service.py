"""The vector store through a real ``shardmgr serve`` process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import shardmgr
from common.wire.errors import BadRequest
from shardmgr.errors import BadVectors, CollectionConflict, UnknownCollection, UnknownRef
from tests.shardmgr.server.serverproc import ServerProcess


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path / "data").start()
    yield proc
    proc.kill()


def test_append_search_get_over_the_wire(server: ServerProcess) -> None:
    with shardmgr.connect(server.address) as client:
        client.create_collection("docs", 24, "ip")
        assert client.collections() == ["docs"]
        data = np.random.default_rng(1).standard_normal((500, 24)).astype(np.float32)
        refs = client.append("docs", data, np.arange(500) + 7, durable=True)
        scores, ids, found = client.search("docs", data[:10], k=5)
        assert scores.shape == ids.shape == found.shape == (10, 5)
        np.testing.assert_allclose(scores[:, 0], np.sort(data[:10] @ data.T, axis=1)[:, -1], rtol=1e-5)
        np.testing.assert_array_equal(client.get("docs", refs[[3, 499]]), data[[3, 499]])
        np.testing.assert_array_equal(client.ids("docs", refs[:3]), [7, 8, 9])
        assert client.collection_info("docs")["rows"] == 500
        client.flush()


def test_wire_errors_are_typed_and_change_nothing(server: ServerProcess) -> None:
    with shardmgr.connect(server.address) as client:
        client.create_collection("c", 4)
        refs = client.append("c", np.ones((2, 4), np.float32), [1, 2])
        with pytest.raises(CollectionConflict):
            client.create_collection("c", 8)
        with pytest.raises(UnknownCollection):
            client.search("nope", np.ones((1, 4), np.float32))
        with pytest.raises(BadVectors, match="shape"):
            client.append("c", np.ones((2, 3), np.float32), [1, 2])
        with pytest.raises(BadVectors, match="NaN"):
            client.append("c", np.array([[np.nan, 0, 0, 0]], np.float32), [1])
        with pytest.raises(BadVectors, match="floating point"):  # the same errors as embedded
            client.append("c", np.ones((2, 4), np.int32), [1, 2])
        with pytest.raises(BadVectors, match="ids must be integers"):
            client.append("c", np.ones((2, 4), np.float32), [1.0, 2.0])
        with pytest.raises(UnknownRef):
            client.get("c", [refs[-1] + 1])
        with pytest.raises(BadVectors, match="integer"):  # never truncated to another row's ref
            client.get("c", np.array([refs[-1] + 0.5]))
        with pytest.raises(BadVectors, match="k must be"):
            client.search("c", np.ones((1, 4), np.float32), k=-1)
        with pytest.raises(BadRequest, match="'k'"):
            client.search("c", np.ones((1, 4), np.float32), k=2.5)
        assert client.collection_info("c")["rows"] == 2
        one = client.append("c", np.ones(4, np.float32), [3])  # a single vector, as embedded takes it
        _, _, nearest = client.search("c", np.ones(4, np.float32), k=np.int64(3))
        assert nearest.shape == (1, 3) and len(one) == 1
        assert client.collection_info("c")["rows"] == 3
