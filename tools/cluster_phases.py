"""The measured phases of tools/bench_cluster.py: each call measures one
configuration once and returns its figures, for rounds.interleave.

publish: a sealed shard's files (vectors, ids, journal of ``size`` bytes in
all) go up through our path, ``ObjectStore.put_file`` for each file (crc32c
of the file, write-once upload, HEAD to check the stored size and crc32c),
then ``ShardMap.publish`` (one fenced etcd transaction), as uploader.py does;
the baseline is boto3's ``upload_file`` of the same files with the same
TransferConfig (multipart threshold, part size, concurrency) and client
settings. Each run writes new keys; they are deleted after the clock stops.

fill: one object of the shard (its vectors) comes down through our path,
``ObjectStore.fetch`` (HEAD, download into a temporary file, crc32c and
size checked, fsync, rename, directory fsync), as a query node's cache fill
does; the baseline is boto3's ``download_file`` of the same object with the
same settings (it writes the file, no checksum, no fsync). A second
reference, ``raw+fsync``, adds one fsync of the file after that download:
the least a durable fill costs on this disk. The object is
uploaded once per size before the rounds; the file is removed after the
clock stops.

Every measurement starts after an ``os.sync()``: the write-back of the
previous one (the S3 server's files, a downloaded file) is finished, so it
does not slow whichever side comes next.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
import numpy as np
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.state.election import Election, Writer
from shardmgr.cluster.state.lease import NodeLease
from shardmgr.cluster.state.objects import ObjectStore
from shardmgr.cluster.state.shard_map import ShardEntry, ShardMap, ShardObject
from shardmgr.cluster.testing.loopback import EtcdServer, WeedServer
from shardmgr.store.rows import HEADER_SIZE

DIM = 128
JOURNAL_BYTES = 256 << 10  # a sealed shard's journal: a record per batch, small beside its rows
MiB = 1 << 20
BUCKET = "bench"
#: the publish and fill phases' state in Bench.state, and their key and object prefix
TRANSFERS = "transfers"
#: the fill phase's second reference: the raw download, then one fsync of the file (what durability costs at least)
SYNCED = "raw+fsync"


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One configuration: ``phase`` publish or fill, ``system`` ours, raw (or raw+fsync: fill), of a shard of
    ``size`` bytes."""

    phase: str
    system: str
    size: int

    def __str__(self) -> str:
        return f"{self.phase} {self.system} {self.size // MiB} MiB"


@dataclasses.dataclass
class Bench:
    """What every phase shares: the servers, the S3 credentials (a boto3
    session, and the same as environment variables for ``shardmgr serve``
    children), a scratch directory, and each phase group's own state by name
    (``state``: set up by its ``prepare``, released by its ``finish``)."""

    etcd: EtcdServer
    weed: WeedServer
    session: boto3.session.Session
    env: dict[str, str]
    directory: Path
    state: dict[str, Any] = dataclasses.field(default_factory=dict)

    def config(self, prefix: str) -> ClusterConfig:
        """A cluster config of its own for a phase group: key prefix ``/prefix``, object prefix ``prefix``."""
        return ClusterConfig.from_urls(self.etcd.url(prefix), f"s3://{BUCKET}/{prefix}", s3_endpoint=self.weed.endpoint)


@dataclasses.dataclass
class Transfers:
    """The publish and fill phases' state: both clients, the shards' files, the fill objects, a writer's token."""

    config: ClusterConfig
    store: ObjectStore
    raw: Any  # a boto3 S3 client with the ObjectStore's settings
    transfer: TransferConfig
    lease: NodeLease
    token: Writer
    directory: Path
    shards: dict[int, list[tuple[str, Path]]] = dataclasses.field(default_factory=dict)
    uploaded: dict[int, ShardObject] = dataclasses.field(default_factory=dict)
    next_id: int = 1


def raw_client(config: ClusterConfig, session: boto3.session.Session) -> tuple[Any, TransferConfig]:
    """A plain boto3 client and TransferConfig with exactly the settings ObjectStore uses (no write-once hook)."""
    client = session.client(
        "s3", endpoint_url=config.s3_endpoint, region_name=config.s3_region,
        config=Config(s3={"addressing_style": "path"}, signature_version="s3v4",
                      connect_timeout=config.s3_connect_timeout_s, read_timeout=config.s3_read_timeout_s,
                      retries={"max_attempts": config.s3_max_attempts, "mode": "standard"},
                      max_pool_connections=max(10, 2 * config.transfer_concurrency)))
    transfer = TransferConfig(multipart_threshold=config.multipart_threshold_bytes,
                              multipart_chunksize=config.multipart_chunk_bytes,
                              max_concurrency=config.transfer_concurrency, use_threads=True)
    return client, transfer


def shard_files(directory: Path, size: int, seed: int) -> list[tuple[str, Path]]:
    """A sealed shard's three files, ``size`` bytes in all, of random bytes (S3 gets no help from compression)."""
    rows = (size - JOURNAL_BYTES - 2 * HEADER_SIZE) // (DIM * 4 + 8)
    rng = np.random.default_rng(seed)
    files = []
    for name, nbytes in (("vectors", HEADER_SIZE + rows * DIM * 4), ("ids", HEADER_SIZE + rows * 8),
                         ("journal", JOURNAL_BYTES)):
        path = directory / f"shard-{size}-{name}"
        with open(path, "wb") as f:
            for start in range(0, nbytes, 16 * MiB):
                f.write(rng.integers(0, 256, min(16 * MiB, nbytes - start), dtype=np.uint8).tobytes())
        files.append((name, path))
    return files


def prepare_transfers(bench: Bench, args: argparse.Namespace) -> None:
    """Once for both phases: the clients, a writer's token, each size's shard files on disk, and each size's
    vectors uploaded for the fill phase."""
    if TRANSFERS in bench.state:
        return
    config = bench.config(TRANSFERS)
    store = ObjectStore(config, session=bench.session)
    store.create_bucket()
    raw, transfer = raw_client(config, bench.session)
    lease = NodeLease(config, name="bench").start()
    token = Election(config, "bench").campaign("bench", lease, timeout_s=10)
    if token is None:
        raise RuntimeError("could not become the writer of the benchmark's collection")
    directory = bench.directory / TRANSFERS
    directory.mkdir()
    t = bench.state[TRANSFERS] = Transfers(config, store, raw, transfer, lease, token, directory)
    for i, size in enumerate(args.sizes):
        t.shards[size] = shard_files(directory, size, seed=i)
        name, path = t.shards[size][0]
        info = store.put_file(path, config.object_key("fill", str(size), name))
        assert info.crc32c is not None
        t.uploaded[size] = ShardObject(name, info.key, info.size, info.crc32c)


def finish_transfers(bench: Bench) -> None:
    t: Transfers | None = bench.state.pop(TRANSFERS, None)
    if t is not None:
        t.lease.close()
        t.store.close()
        t.raw.close()


def shard_bytes(t: Transfers, config: Transfer) -> int:
    return sum(p.stat().st_size for _, p in t.shards[config.size])


def measure_publish(bench: Bench, config: Transfer) -> dict[str, float]:
    """One publish of a shard of ``config.size`` (module docstring); MB/s of its files."""
    t: Transfers = bench.state[TRANSFERS]
    shard_id, t.next_id = t.next_id, t.next_id + 1
    shard_map = ShardMap(t.config, "bench")
    keys = {name: (shard_map.object_key(shard_id, t.token, name) if config.system == "ours"
                   else t.config.object_key("raw", str(shard_id), name)) for name, _ in t.shards[config.size]}
    os.sync()  # no write-back left from the previous measurement (the S3 server's or ours) lands on this one
    started = time.perf_counter()
    if config.system == "ours":
        objects = []
        for name, path in t.shards[config.size]:
            info = t.store.put_file(path, keys[name])
            assert info.crc32c is not None
            objects.append(ShardObject(name, info.key, info.size, info.crc32c))
        shard_map.publish(t.token, ShardEntry("bench", shard_id, 0, tuple(objects)))
    else:
        for name, path in t.shards[config.size]:
            t.raw.upload_file(str(path), t.config.bucket, keys[name], Config=t.transfer)
    seconds = time.perf_counter() - started
    for key in keys.values():
        t.store.delete(key)
    return {"MBps": shard_bytes(t, config) / seconds / 1e6, "seconds": seconds}


def measure_fill(bench: Bench, config: Transfer) -> dict[str, float]:
    """One cache fill of the size's vectors object (module docstring); MB/s."""
    t: Transfers = bench.state[TRANSFERS]
    obj = t.uploaded[config.size]
    dest = t.directory / f"fill-{uuid.uuid4().hex[:8]}"
    os.sync()  # as in measure_publish
    started = time.perf_counter()
    if config.system == "ours":
        t.store.fetch(obj.key, dest, size=obj.size, crc=obj.crc32c)
    else:
        t.raw.download_file(t.config.bucket, obj.key, str(dest), Config=t.transfer)
        if config.system == SYNCED:
            fd = os.open(dest, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    seconds = time.perf_counter() - started
    if os.path.getsize(dest) != obj.size:
        raise RuntimeError(f"{config}: {os.path.getsize(dest)} bytes arrived, not {obj.size}")
    dest.unlink()
    return {"MBps": obj.size / seconds / 1e6, "seconds": seconds}
