"""The measured phases of tools/bench_shards.py: each call measures one
configuration once and returns its figures, for rounds.interleave.

Ingest: the same float32 vectors and int64 ids written in batches, by the
store embedded, by ``shardmgr serve`` over loopback ("wire": StoreClient
appends, the server started before the clock), or raw (one ``os.writev``
of both arrays per batch to one file), either
durable per batch (each batch waits for its ``fdatasync``) or not (one
``fdatasync`` or ``flush()`` at the end). Search and get: one prepared data
set (:class:`SearchSet`), searched by plain faiss and by the store.

Every ingest starts on warm memory (:func:`warm_pages`, just before its
clock starts). On this machine (a Firecracker VM) a page-cache page the
guest has not used for a few seconds costs about 10 µs the first time it
is written (host memory handed back and faulted in again): a cold 512 KiB
batch took 1.2-1.9 ms to pwrite, a warm one 65-130 µs. Without the warm-up
each run's figure said mostly whether the run before it had just freed
as many pages (docs/benchmarks.md, "Ingest over the wire").
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faiss
import numpy as np

import shardmgr
from shardmgr.server import readiness

QUERIES = 1000
SINGLE_QUERIES = 20  # one call each: faiss takes tens of ms per query over 1M rows here
GET_CALLS = 20
GET_ROWS = 1000
K = 10
FILL_BATCH = 100_000


def data(rows: int, dim: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, dim), dtype=np.float32)


@dataclass(frozen=True)
class Ingest:
    """One ingest configuration: ``system`` "raw", "ours" (embedded) or "wire" (over loopback);
    ``durable``: every batch waits for its sync."""

    system: str
    durable: bool
    writers: int
    rows: int
    dim: int
    batch: int

    @property
    def mode(self) -> str:
        if self.system == "raw":
            return "writev + fdatasync per batch" if self.durable else "writev, one fdatasync at the end"
        where = ", over the wire" if self.system == "wire" else ""
        if not self.durable:
            return "default, one flush() at the end" + where
        return "durable=True" + (f", {self.writers} writers" if self.writers > 1 else "") + where

    def __str__(self) -> str:
        return f"ingest {self.rows:,} x {self.dim}, batches of {self.batch:,}: {self.system} {self.mode}"


def ingest_configs(rows: int, dim: int, batch: int, writers: int, wire: bool = False) -> list[Ingest]:
    """Ours (and over the wire) and its raw baseline alternate, the non-durable ones first."""
    configs: list[Ingest] = []
    for durable in (False, True):
        configs.append(Ingest("ours", durable, 1, rows, dim, batch))
        if wire:
            configs.append(Ingest("wire", durable, 1, rows, dim, batch))
        configs.append(Ingest("raw", durable, 1, rows, dim, batch))
    if writers > 1:
        configs.append(Ingest("ours", True, writers, rows, dim, batch))
    return configs


def measure_ingest(config: Ingest, directory: Path, vectors: np.ndarray) -> dict[str, float]:
    """MB/s of vector + id bytes made durable (by the end, or per batch)."""
    ids = np.arange(len(vectors), dtype=np.int64)
    if config.system == "raw":
        elapsed = raw_ingest(directory / "raw", vectors, ids, config.batch, config.durable)
    elif config.system == "wire":
        elapsed = wire_ingest(directory / "wire", vectors, ids, config.batch, config.durable)
    else:
        elapsed = store_ingest(directory / "ours", vectors, ids, config.batch, config.durable, config.writers)
    return {"MBps": (vectors.nbytes + ids.nbytes) / elapsed / 1e6}


WARM_CHUNK = 8 << 20
WARM_FACTOR = 1.25
"""Warm pages per byte of vectors + ids: the store also writes a journal, and the ids in its records."""


def warm_pages(directory: Path, nbytes: int) -> None:
    """Write ``nbytes`` of zeros to a scratch file in ``directory`` and delete
    it: the page-cache pages it took are free again, and warm, for the
    writes that follow at once (module docstring)."""
    path = directory / ".warm"
    zeros = bytes(WARM_CHUNK)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for start in range(0, nbytes, WARM_CHUNK):
            os.write(fd, zeros[:min(WARM_CHUNK, nbytes - start)])
    finally:
        os.close(fd)
        path.unlink()


def _warm_bytes(vectors: np.ndarray, ids: np.ndarray) -> int:
    return int((vectors.nbytes + ids.nbytes) * WARM_FACTOR)


def raw_ingest(path: Path, vectors: np.ndarray, ids: np.ndarray, batch: int, durable: bool) -> float:
    """Seconds to writev each batch's vector and id bytes to one new file and fdatasync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        warm_pages(path.parent, _warm_bytes(vectors, ids))
        started = time.perf_counter()
        for i in range(0, len(vectors), batch):
            parts = [vectors[i:i + batch].data, ids[i:i + batch].data]
            # a regular file takes a whole writev unless the disk is full: a short write is an error here
            if os.writev(fd, parts) != sum(p.nbytes for p in parts):
                raise OSError(f"short write to {path}")
            if durable:
                os.fdatasync(fd)
        if not durable:
            os.fdatasync(fd)
        return time.perf_counter() - started
    finally:
        os.close(fd)
        path.unlink()


def store_ingest(path: Path, vectors: np.ndarray, ids: np.ndarray, batch: int, durable: bool, writers: int) -> float:
    """Seconds for Store.append of every batch from ``writers`` threads (each
    its own share of the batches), then one flush(), into a new store."""
    store = shardmgr.open(path)
    try:
        store.create_collection("c", vectors.shape[1])
        starts = list(range(0, len(vectors), batch))

        def write(mine: list[int]) -> None:
            for i in mine:
                store.append("c", vectors[i:i + batch], ids[i:i + batch], durable=durable)

        threads = [threading.Thread(target=write, args=(starts[w::writers],)) for w in range(writers)]
        warm_pages(path.parent, _warm_bytes(vectors, ids))
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        store.flush()
        return time.perf_counter() - started
    finally:
        store.close()
        shutil.rmtree(path)


def wire_ingest(path: Path, vectors: np.ndarray, ids: np.ndarray, batch: int, durable: bool) -> float:
    """Seconds for StoreClient.append of every batch, then one flush(), to a
    ``shardmgr serve`` of a new store (started, and its collection made,
    before the clock starts)."""
    server, address = start_server(path)
    try:
        with shardmgr.connect(address, timeout=600) as client:
            client.create_collection("c", vectors.shape[1])
            warm_pages(path.parent, _warm_bytes(vectors, ids))
            started = time.perf_counter()
            for i in range(0, len(vectors), batch):
                client.append("c", vectors[i:i + batch], ids[i:i + batch], durable=durable)
            client.flush()
            return time.perf_counter() - started
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(path)


def start_server(path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``shardmgr serve`` on a free port; returns once its ready file says where."""
    ready, log = path.with_name(path.name + ".ready"), path.with_name(path.name + ".log")
    with open(log, "wb") as stderr:  # the server's log: kept beside the data, shown if it fails to start
        proc = subprocess.Popen([sys.executable, "-m", "shardmgr", "serve", "--data", str(path), "--port", "0",
                                 "--ready-file", str(ready)], stderr=stderr)
    host, port = readiness.wait(ready, proc, 3600, log=log.read_text)
    return proc, f"{host}:{port}"


@dataclass
class SearchSet:
    """One data set, with every system that searches it opened once: plain
    faiss (``IndexFlatL2``, its own copy), the embedded store over one
    growing shard and over 8 sealed shards, and ``shardmgr serve`` over
    its own copy of the one-shard layout (one store directory per opener)."""

    rows: int
    dim: int
    directory: Path
    singles: int = SINGLE_QUERIES
    systems: dict[str, Any] = field(default_factory=dict)
    refs: dict[str, np.ndarray] = field(default_factory=dict)
    closers: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.vectors, self.queries = data(self.rows, self.dim, 1), data(QUERIES, self.dim, 2)
        # GET_CALLS calls of GET_ROWS random rows each; faiss gets row numbers, the store their refs
        self.picks = np.random.default_rng(3).integers(0, self.rows, (GET_CALLS, GET_ROWS))

    def open(self, network: bool, start_server: Any) -> SearchSet:
        index = faiss.IndexFlatL2(self.dim)
        index.add(self.vectors)
        self.systems["faiss"] = index
        layouts: tuple[tuple[str, dict[str, Any]], ...] = (
            ("ours, one growing shard", {}), ("ours, 8 sealed shards", {"seal_bytes": self.vectors.nbytes // 8}))
        for label, config in layouts:
            path = self.directory / label.split(", ")[1].replace(" ", "-")
            refs = fill(path, self.vectors, **config)
            store = shardmgr.open(path, **config)
            self.closers.append(store.close)
            self.systems[label], self.refs[label] = store, refs
        if network:
            path = self.directory / "served"
            refs = fill(path, self.vectors)
            server, address = start_server(path)
            client = shardmgr.connect(address, timeout=600)
            self.closers += [client.close, server.terminate, server.wait]
            self.systems["ours over the network, one growing shard"] = client
            self.refs["ours over the network, one growing shard"] = refs
        return self

    def close(self) -> None:
        for close in self.closers:
            close()
        self.closers.clear()
        shutil.rmtree(self.directory, ignore_errors=True)

    def labels(self) -> list[str]:
        """Systems in measuring order: ours and faiss alternate."""
        ours = [name for name in self.systems if name != "faiss"]
        return [ours[0], "faiss", *ours[1:]]

    def measure(self, label: str) -> dict[str, float]:
        """Queries/s for a batch of QUERIES and for ``singles`` queries one at a time; rows/s of get."""
        system = self.systems[label]
        if label == "faiss":
            def search(q: np.ndarray) -> Any:
                return system.search(q, K)

            def get(rows: np.ndarray) -> Any:
                return system.reconstruct_batch(rows)
        else:
            def search(q: np.ndarray) -> Any:
                return system.search("c", q, k=K)

            def get(rows: np.ndarray) -> Any:
                return system.get("c", self.refs[label][rows])
        search(self.queries[:10])  # warm-up: threads, mappings, connection
        get(self.picks[0][:10])
        figures = {"batch_qps": QUERIES / _timed(lambda: search(self.queries))}
        singles = [self.queries[i:i + 1] for i in range(self.singles)]
        figures["single_qps"] = self.singles / _timed(lambda: [search(q) for q in singles])
        figures["get_rows_s"] = self.picks.size / _timed(lambda: [get(rows) for rows in self.picks])
        return figures


def _timed(work: Any) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def fill(path: Path, vectors: np.ndarray, **config: Any) -> np.ndarray:
    """A new store at ``path`` holding ``vectors`` (ids 0..n-1) in collection "c"; their refs."""
    store = shardmgr.open(path, **config)
    try:
        store.create_collection("c", vectors.shape[1])
        refs = [store.append("c", vectors[i:i + FILL_BATCH], np.arange(i, min(i + FILL_BATCH, len(vectors))))
                for i in range(0, len(vectors), FILL_BATCH)]
    finally:
        store.close()
    return np.concatenate(refs)
