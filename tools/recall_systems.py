"""The systems tools/bench_recall.py compares on one data set, and one measurement.

Per index string (a collection each, all in one store): the store embedded,
with every collection one sealed shard (``seal_bytes`` = the data set's
vector bytes, then one far-away row appended to seal it, so the store's
shard and merge layer is measured over the same single index faiss has);
plain faiss, the same index string built by faiss on the same rows and
trained on the same even sample, searched in process; and ``shardmgr serve``
over a copy of the store's directory (a store directory has one opener).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from recall_data import METRICS, DataSet, K, recall
from shard_extras import start_server

import shardmgr

FILL_BATCH = 100_000
EXACT = "flat"
SYSTEMS = ("ours", "faiss", "network")

Search = Callable[[np.ndarray], np.ndarray]
"""Queries -> the ids of their top K."""


@dataclass(frozen=True)
class Setting:
    """One index string at one set of search parameters, searched by one system."""

    spec: str
    params: tuple[tuple[str, int], ...]
    system: str

    @property
    def knobs(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.params) or "exact"

    def __str__(self) -> str:
        return f"{self.spec} {self.knobs}: {self.system}"


def far_row(metric: str, dim: int) -> np.ndarray:
    """A row no query has among its nearest: zeros score 0 under ip (queries are unit vectors), 1e4 is far in l2."""
    return np.full((1, dim), 0.0 if metric == "ip" else 1e4, dtype=np.float32)


def train_sample(vectors: np.ndarray, train_rows: int) -> np.ndarray:
    """The even sample the store trains on (shardmgr/store/index.py ``build``)."""
    step = max(1, len(vectors) // train_rows)
    return np.ascontiguousarray(vectors[::step][:train_rows])


def faiss_index(data: DataSet, spec: str, train_rows: int) -> faiss.Index:
    """``spec`` built by faiss itself over every row (ids are row numbers)."""
    index = faiss.index_factory(data.dim, "Flat" if spec == EXACT else spec, METRICS[data.metric])
    if not index.is_trained:
        index.train(train_sample(data.vectors, train_rows))
    index.add(data.vectors)
    return index


def fill_store(path: Path, data: DataSet, specs: list[str], train_rows: int) -> dict[str, float]:
    """A store at ``path`` with one collection per spec, each one sealed shard with its index built;
    seconds from each collection's seal to its index being ready (built one after another)."""
    build_s: dict[str, float] = {}
    with shardmgr.open(path, seal_bytes=data.vectors.nbytes, index_train_rows=train_rows) as store:
        for i, spec in enumerate(specs):
            name = f"c{i}"
            store.create_collection(name, data.dim, data.metric, spec)
            for start in range(0, data.rows, FILL_BATCH):
                end = min(start + FILL_BATCH, data.rows)
                store.append(name, data.vectors[start:end], np.arange(start, end))
            store.append(name, far_row(data.metric, data.dim), [data.rows])  # the full shard seals first
            started = time.perf_counter()
            store.wait_for_indexes(timeout=3600)
            build_s[spec] = time.perf_counter() - started
            info = store.collection_info(name)
            if info["sealed"] != 1:
                raise RuntimeError(f"{spec}: expected one sealed shard, got {info}")
    return build_s


@dataclass
class Systems:
    """Every system over one data set, opened once, measured by :meth:`measure`."""

    data: DataSet
    specs: list[str]
    directory: Path
    train_rows: int
    network: bool = True
    single: int = 200
    single_s: float = 2.0
    batches: int = 1
    build_s: dict[str, dict[str, float]] = field(default_factory=dict)
    faiss: dict[str, faiss.Index] = field(default_factory=dict)
    clients: dict[str, Any] = field(default_factory=dict)
    closers: list[Callable[[], Any]] = field(default_factory=list)

    def open(self) -> Systems:
        path = self.directory / "store"
        self.build_s["ours"] = fill_store(path, self.data, self.specs, self.train_rows)
        self.build_s["faiss"] = {}
        for spec in self.specs:
            started = time.perf_counter()
            self.faiss[spec] = faiss_index(self.data, spec, self.train_rows)
            self.build_s["faiss"][spec] = time.perf_counter() - started
        if self.network:
            shutil.copytree(path, self.directory / "served")
            server, address = start_server(self.directory / "served")
            self.closers += [server.wait, server.terminate]
            self.clients["network"] = shardmgr.connect(address, timeout=600)
            self.closers.append(self.clients["network"].close)
        store = shardmgr.open(path, seal_bytes=self.data.vectors.nbytes, index_train_rows=self.train_rows)
        self.closers.append(store.close)
        store.wait_for_indexes(timeout=60)  # loaded from their files, not rebuilt
        self.clients["ours"] = store
        return self

    def close(self) -> None:
        while self.closers:
            self.closers.pop()()
        shutil.rmtree(self.directory, ignore_errors=True)

    def searcher(self, setting: Setting) -> Search:
        params = dict(setting.params)
        if setting.system == "faiss":
            index = self.faiss[setting.spec]
            for knob, value in params.items():  # faiss's own way to set nprobe / efSearch, through pre-transforms
                faiss.ParameterSpace().set_index_parameter(index, knob, value)

            def direct(q: np.ndarray) -> np.ndarray:
                ids: np.ndarray = index.search(q, K)[1]
                return ids

            return direct
        client, name = self.clients[setting.system], f"c{self.specs.index(setting.spec)}"

        def ours(q: np.ndarray) -> np.ndarray:
            return np.asarray(client.search(name, q, K, params or None)[1])

        return ours

    def measure(self, setting: Setting) -> dict[str, float]:
        """recall@K of the batch, queries/s for ``batches`` batches and for up to ``single`` one-query calls."""
        return measure(self.searcher(setting), self.data.queries, self.data.exact(), self.single, self.single_s,
                       self.batches)


def measure(search: Search, queries: np.ndarray, truth: np.ndarray, single: int, single_s: float,
            batches: int = 1) -> dict[str, float]:
    """One run: a warm-up, ``batches`` batches timed together (a batch of a thousand queries at nprobe 1 takes
    ~10 ms, too short to time once on a shared machine), then one query per call until ``single`` calls or
    ``single_s`` seconds (at least 3 calls; the rate is what is compared, so a slow system may make fewer;
    ``single`` 0: none, and no ``single_qps``)."""
    search(queries[:10])
    started = time.perf_counter()
    for _ in range(batches):
        found = search(queries)
    figures = {"batch_qps": batches * len(queries) / (time.perf_counter() - started), "recall": recall(found, truth)}
    if single < 1:
        return figures
    calls = 0
    started = time.perf_counter()
    while calls < min(single, len(queries)):
        search(queries[calls:calls + 1])
        calls += 1
        if calls >= 3 and time.perf_counter() - started > single_s:
            break
    figures["single_qps"] = calls / (time.perf_counter() - started)
    return figures
