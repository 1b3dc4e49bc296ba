"""The object store: sealed shard files in an S3-compatible bucket.

Objects are written once and never replaced: every PutObject and
CompleteMultipartUpload this client sends carries ``If-None-Match: *``, so a
put onto an existing key is refused by the server (``ObjectExists``), and of
two racing puts exactly one wins; the stored object is never a mix.

Each object carries its crc32c and size as metadata (``x-amz-meta-crc32c``,
8 hex digits, and ``x-amz-meta-size``), computed from the local file before
the upload. :meth:`ObjectStore.put_file` checks after the upload that the
stored object has that size and metadata. :meth:`ObjectStore.fetch` writes
into a temporary file beside the destination, checks size and crc32c of what
arrived against the caller's expectation (the shard map's entry) or else the
metadata, fsyncs it and renames it into place, then fsyncs the directory:
the destination either does not exist or holds verified, durable bytes. The
crc32c is computed as the bytes arrive (checked_file.py; the file is read
again only if the pieces did not tile it once), and write-back starts as
they are written, so the fsync at the end has little left to do.

Files at least ``multipart_threshold_bytes`` long move in parts of
``multipart_chunk_bytes``, ``transfer_concurrency`` at a time (boto3's
transfer manager). Requests use path-style addressing, ``s3v4`` signatures
and botocore's standard retries (``s3_max_attempts``). Credentials come from
boto3's standard chain, or from the session the caller passes.

Every failure is an ``ObjectStoreError`` naming the bucket and key (and the
endpoint), with boto's exception as its cause.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import crc32c
from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    NoCredentialsError,
    PartialCredentialsError,
)
from s3transfer.exceptions import RetriesExceededError
from s3transfer.subscribers import BaseSubscriber

from common.journal.filesystem import fsync_dir
from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import (
    ChecksumMismatch,
    ObjectExists,
    ObjectMissing,
    ObjectStoreDenied,
    ObjectStoreError,
    ObjectStoreUnavailable,
)
from shardmgr.cluster.state.checked_file import CheckedFile

CHUNK = 8 << 20
MISSING = {"NoSuchKey", "NoSuchBucket", "NotFound", "404"}
DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "403"}
BUSY = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "503", "500"}


@dataclasses.dataclass(frozen=True, slots=True)
class ObjectInfo:
    """An object as the store describes it; ``crc32c`` is None where unknown
    (listings); ``modified``: when it was stored (seconds since the epoch, by
    the store's clock; 0 when unknown)."""

    key: str
    size: int
    crc32c: int | None
    etag: str
    modified: float = 0.0


def file_crc32c(path: Path) -> tuple[int, int]:
    """(crc32c, size) of a file, read in 8 MiB chunks."""
    value, size = 0, 0
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            value = crc32c.crc32c(view[:n], value=value)
            size += n
    return value, size


class _Known(BaseSubscriber):  # type: ignore[misc]
    """Tells s3transfer the size and ETag fetch's own HEAD found, so it does
    not ask again; the ranged GETs then carry ``If-Match`` with that ETag,
    so an object replaced mid-download fails instead of mixing versions."""

    def __init__(self, stored: ObjectInfo) -> None:
        self.stored = stored

    def on_queued(self, future: Any, **kwargs: Any) -> None:
        future.meta.provide_transfer_size(self.stored.size)
        if self.stored.etag:
            future.meta.provide_object_etag(self.stored.etag)


def _if_none_match(params: dict[str, Any], **_: Any) -> None:
    params.setdefault("IfNoneMatch", "*")


PROBES = ".probes"
"""Under the object prefix, where :meth:`ObjectStore.probe` writes (collection names never start with a dot)."""


class ObjectStore:
    """The cluster's bucket (``config.bucket``). Thread-safe (boto3 clients are)."""

    def __init__(self, config: ClusterConfig, *, session: boto3.session.Session | None = None) -> None:
        self.config = config
        self.bucket = config.bucket
        self.where = config.s3_endpoint or f"S3 {config.s3_region}"
        session = session if session is not None else boto3.session.Session()
        self._s3: Any = session.client(
            "s3", endpoint_url=config.s3_endpoint, region_name=config.s3_region,
            config=Config(s3={"addressing_style": "path"}, signature_version="s3v4",
                          connect_timeout=config.s3_connect_timeout_s, read_timeout=config.s3_read_timeout_s,
                          retries={"max_attempts": config.s3_max_attempts, "mode": "standard"},
                          max_pool_connections=max(10, 2 * config.transfer_concurrency)))
        # Write-once everywhere, including the requests boto3's transfer manager
        # makes itself (its upload_file takes no If-None-Match argument).
        events = self._s3.meta.events
        events.register("before-parameter-build.s3.PutObject", _if_none_match)
        events.register("before-parameter-build.s3.CompleteMultipartUpload", _if_none_match)
        self._transfer = TransferConfig(multipart_threshold=config.multipart_threshold_bytes,
                                        multipart_chunksize=config.multipart_chunk_bytes,
                                        max_concurrency=config.transfer_concurrency, use_threads=True)

    def close(self) -> None:
        self._s3.close()

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    @contextlib.contextmanager
    def _errors(self, what: str, key: str) -> Iterator[None]:
        """Translate boto's errors for ``what`` on ``key`` (module docstring)."""
        try:
            yield
        except ObjectStoreError:
            raise
        except (ClientError, BotoCoreError, RetriesExceededError) as e:
            raise translate(e, f"{self.url(key)} at {self.where}: {what}") from e

    def create_bucket(self) -> None:
        """Create the bucket if it does not exist (deployments usually make it beforehand)."""
        with self._errors("create bucket", ""):
            try:
                self._s3.head_bucket(Bucket=self.bucket)
            except ClientError as e:
                if str(e.response.get("Error", {}).get("Code")) not in MISSING:
                    raise
                with contextlib.suppress(self._s3.exceptions.BucketAlreadyOwnedByYou):
                    self._s3.create_bucket(Bucket=self.bucket)

    def put_file(self, path: Path, key: str) -> ObjectInfo:
        """Upload ``path`` to ``key`` only if no object is there (ObjectExists
        otherwise: the stored object is unchanged), with its crc32c and size
        as metadata; then check the stored object's size and metadata. A
        failed multipart upload is aborted (its parts are not kept)."""
        crc, size = file_crc32c(path)
        metadata = {"crc32c": f"{crc:08x}", "size": str(size)}
        with self._errors("put", key), create_transfer_manager(self._s3, self._transfer) as manager:
            manager.upload(str(path), self.bucket, key, extra_args={"Metadata": metadata}).result()
        stored = self.head(key)
        if stored is None or stored.size != size or stored.crc32c != crc:
            raise ChecksumMismatch(f"{self.url(key)} at {self.where}: stored as {stored} after uploading "
                                   f"{size} bytes with crc32c {crc:08x} from {path}")
        return stored

    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        """Store ``data`` at ``key`` only if no object is there (as put_file)."""
        crc = crc32c.crc32c(data)
        with self._errors("put", key):
            answer = self._s3.put_object(Bucket=self.bucket, Key=key, Body=data,
                                         Metadata={"crc32c": f"{crc:08x}", "size": str(len(data))})
        return ObjectInfo(key=key, size=len(data), crc32c=crc, etag=str(answer.get("ETag", "")))

    def head(self, key: str) -> ObjectInfo | None:
        """The object's size, crc32c (from its metadata) and ETag; None if there is no such object."""
        with self._errors("head", key):
            try:
                answer = self._s3.head_object(Bucket=self.bucket, Key=key)
            except ClientError as e:
                if str(e.response.get("Error", {}).get("Code")) in MISSING:
                    return None
                raise
        recorded = answer.get("Metadata", {}).get("crc32c")
        return ObjectInfo(key=key, size=int(answer["ContentLength"]), etag=str(answer.get("ETag", "")),
                          crc32c=int(recorded, 16) if recorded else None, modified=_epoch(answer.get("LastModified")))

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    def fetch(self, key: str, dest: Path, *, size: int | None = None, crc: int | None = None) -> ObjectInfo:
        """Download ``key`` to ``dest`` (replacing it) and verify it: size and
        crc32c must equal ``size``/``crc`` when given (the shard map's values)
        and the object's metadata. Raises ObjectMissing if there is no such
        object, ChecksumMismatch if the bytes or metadata disagree; on any
        failure ``dest`` is untouched and no temporary file is left."""
        stored = self.head(key)
        if stored is None:
            raise ObjectMissing(f"{self.url(key)} at {self.where}: no such object")
        want_crc = crc if crc is not None else stored.crc32c
        want_size = size if size is not None else stored.size
        if want_crc is None or stored.crc32c not in (None, want_crc) or stored.size != want_size:
            raise ChecksumMismatch(f"{self.url(key)} at {self.where}: stored {stored.size} bytes, crc32c "
                                   f"{_hex(stored.crc32c)}; expected {want_size} bytes, crc32c {_hex(want_crc)}")
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:12]}.part")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                with CheckedFile(fd) as target, self._errors("fetch", key), \
                        create_transfer_manager(self._s3, self._transfer) as manager:  # checksummed as it arrives
                    manager.download(self.bucket, key, target, subscribers=[_Known(stored)]).result()
                got_crc, got_size = target.checksum() or file_crc32c(tmp)
                if (got_crc, got_size) != (want_crc, want_size):
                    raise ChecksumMismatch(f"{self.url(key)} at {self.where}: fetched {got_size} bytes with crc32c "
                                           f"{got_crc:08x}; expected {want_size} bytes with crc32c {want_crc:08x}")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(dest.parent)
        return dataclasses.replace(stored, crc32c=want_crc)

    def probe(self, name: str) -> None:
        """Put and delete a small object ``<object prefix>/.probes/<name>-<random>``
        (a name no collection can have): a node refuses to start unless this
        works, since it could never publish. Raises what the put or delete
        raises, its message led by what the probe is (one line)."""
        key = self.config.object_key(PROBES, f"{name}-{uuid.uuid4().hex[:12]}")
        try:
            self.put_bytes(key, b"shardmgr probe\n")
            self.delete(key)
        except ObjectStoreError as e:
            raise type(e)(f"the object store refused a test write (a put and a delete), so this node could "
                          f"never publish: {e}") from e

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in key order (crc32c not included: head each)."""
        found: list[ObjectInfo] = []
        with self._errors("list", prefix + "*"):
            for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                found.extend(ObjectInfo(key=o["Key"], size=int(o["Size"]), crc32c=None, etag=str(o.get("ETag", "")),
                                        modified=_epoch(o.get("LastModified"))) for o in page.get("Contents", []))
        return found

    def delete(self, key: str) -> None:
        """Delete the object (no error if it does not exist)."""
        with self._errors("delete", key):
            self._s3.delete_object(Bucket=self.bucket, Key=key)


def translate(e: Exception, where: str) -> ObjectStoreError:
    """The ObjectStoreError for boto's ``e`` (the caller chains it as the cause)."""
    if isinstance(e, ClientError):
        error = e.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        text = f"{where}: {code or status}: {error.get('Message', '') or e}"
        if code == "PreconditionFailed" or status == 412:
            return ObjectExists(f"{where}: an object is already there (write-once put refused)")
        if code in MISSING:
            return ObjectMissing(text)
        if code in DENIED:
            return ObjectStoreDenied(text)
        if code in BUSY or status >= 500:
            return ObjectStoreUnavailable(text)
        return ObjectStoreError(text)
    if isinstance(e, NoCredentialsError | PartialCredentialsError):
        return ObjectStoreDenied(f"{where}: no usable S3 credentials (set AWS_ACCESS_KEY_ID and "
                                 f"AWS_SECRET_ACCESS_KEY, or AWS_PROFILE): {e}")
    if isinstance(e, ConnectionError | RetriesExceededError):
        return ObjectStoreUnavailable(f"{where}: {e}")
    return ObjectStoreError(f"{where}: {type(e).__name__}: {e}")


def _hex(value: int | None) -> str:
    return "none" if value is None else f"{value:08x}"


def _epoch(when: Any) -> float:
    """A boto datetime as seconds since the epoch (0.0 if absent)."""
    return float(when.timestamp()) if when is not None else 0.0
