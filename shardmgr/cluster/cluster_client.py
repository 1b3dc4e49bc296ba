"""The network client of a whole cluster: ``shardmgr.connect_cluster``.

Same methods as StoreClient (shardmgr/store/client.py), given the
cluster's ``etcd://HOST:PORT/PREFIX`` instead of one node's address
(docs/cluster.md, "Forwarded writes and connect_cluster"). It reads the
live members from etcd (``<prefix>/members/<node>``: JSON ``{"node",
"address"}``) and talks to them with StoreClients, one per node.

- **Reads and creates** (``search``, ``get``, ``ids``, ``collections``,
  ``collection_info``, and ``create_collection``, idempotent across the
  cluster) go to one member, kept while it answers: ``prefer`` if it is a
  member, else one at random. When a call fails for want of that node
  (``unavailable``: it cannot be reached, the connection broke, it is
  stopping or not joined) the client reads the members again and repeats
  the call on another, at most ``attempts`` nodes in all.
- **Reads after a delete.** Once a delete (``delete``, ``delete_ids``) is
  acknowledged, this client reads that collection from the node that
  acknowledged it: that node skips the deleted rows at once, while other
  nodes skip them only once the writer has published them (within about
  ``scan_interval_s``; docs/cluster.md, "When a delete is seen"). Each of
  its search and get replies says whether it still holds acknowledged
  deletes of the collection (``held_deletes``) and the revision of its
  cluster state (``state_revision``: docs/protocol.md). The first reply
  that holds none ends the pin: reads go to the usual node again, each
  naming that revision (``after``), so that no node answers them from an
  older state (one behind answers ``watch_behind`` and another is tried).
  If the pinned node fails, reads go to any node again.
- **Appends and deletes** go to the collection's writer when etcd names
  one (``<prefix>/writers/<collection>``, cached), else to any member,
  which forwards them (forwarding.py) or becomes the writer. Only where
  nothing was sent (the connection could not be made, or the node answered
  ``unavailable``, applying nothing) is another node tried; a
  WriterElsewhere (nothing written: the role moved) drops the cache and
  the call goes once to the address it names. **A write whose connection
  breaks or times out after it was sent is never repeated**: it may have
  applied, and ConnectionLost (or WriterUnreachable, from a node that
  forwarded it) reaches the caller, to be treated like any lost reply.

Options go to each StoreClient (and so to RpcClient: ``timeout``,
``token``, ``tls``, ``ca``, ...), except that ``retry_for`` defaults to
MEMBER_RETRY_S here: a dead member is given up quickly for the next.
``etcd_security`` (an EtcdSecurity: TLS, client certificate, etcd user) is
how etcd is reached, as for the nodes; a non-loopback etcd without TLS is
refused (BadClusterConfig) unless its ``insecure`` is set.

Threads: not thread-safe (like StoreClient): one per thread.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from common.wire.client import Reply
from common.wire.errors import ServiceError, Unavailable
from shardmgr.cluster.config import EtcdSecurity, parse_etcd_url
from shardmgr.cluster.errors import CoordinationError, WriterElsewhere
from shardmgr.cluster.state.election import Writer
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.membership import Member
from shardmgr.store import SearchResult, StoreClient, Timeout

T = TypeVar("T")

MEMBER_RETRY_S = 1.0
"""Default ``retry_for`` of each node's connection: how long a member that refuses connections is retried."""

DEFAULT_ATTEMPTS = 3
"""Nodes a call is tried on, at most (plus one more for a write sent on to the writer a refusal named)."""


@dataclasses.dataclass(frozen=True, slots=True)
class EtcdAddress:
    """A cluster's etcd endpoint and key prefix, from ``etcd://HOST[:PORT]/PREFIX``, and how to reach it."""

    etcd_host: str
    etcd_port: int
    key_prefix: str
    etcd_timeout_s: float = 2.0
    etcd_security: EtcdSecurity = EtcdSecurity()

    @classmethod
    def parse(cls, url: str, etcd_timeout_s: float, etcd_security: EtcdSecurity | None = None) -> EtcdAddress:
        """BadClusterConfig for a malformed URL, or security settings etcd_security.validate refuses."""
        host, port, prefix = parse_etcd_url(url)
        return cls(host, port, prefix, etcd_timeout_s, (etcd_security or EtcdSecurity()).validate(host))

    def key(self, *parts: str) -> str:
        return "/".join((self.key_prefix, *parts))


def _not_applied(e: ServiceError) -> bool:
    """True if ``e`` promises the request was not applied: exactly ``unavailable``
    (a connection that could not be made, a node stopping), not a lost connection."""
    return e.code == Unavailable.code


class NodeClient(StoreClient):
    """A StoreClient of one node for the cluster client: its searches and gets
    name the revision in ``after`` (when set) and keep their reply's result."""

    def __init__(self, address: str, **options: Any) -> None:
        super().__init__(address, **options)
        self.after = 0
        self.answer: dict[str, Any] = {}

    def _read(self, cmd: str, args: dict[str, Any], parts: dict[str, np.ndarray], timeout: float | None) -> Reply:
        reply = super()._read(cmd, {**args, "after": self.after} if self.after else args, parts, timeout)
        self.answer = reply.result
        return reply


class ClusterClient:
    """A client of every node of one cluster (module docstring)."""

    def __init__(self, url: str, *, prefer: str | None = None, attempts: int = DEFAULT_ATTEMPTS,
                 etcd_timeout_s: float = 2.0, etcd_security: EtcdSecurity | None = None,
                 **options: Any) -> None:
        """``url``: ``etcd://HOST[:PORT]/PREFIX``; ``prefer``: a node id to
        read from while it is a member; ``attempts``: nodes a call is tried on;
        ``etcd_security``: TLS and user for etcd; ``options``: for each node's StoreClient."""
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.url = url
        self.etcd = EtcdAddress.parse(url, etcd_timeout_s, etcd_security)
        self.prefer = prefer
        self.attempts = attempts
        self.options = {"retry_for": MEMBER_RETRY_S, **options}
        self._kv = Kv(self.etcd)
        self._members: dict[str, str] = {}  # node id -> address, as last read
        self._clients: dict[str, NodeClient] = {}  # address -> its client
        self._reader: str | None = None  # where reads go while it answers
        self._writers: dict[str, str] = {}  # collection -> its writer's address, as last read
        self._deleted_at: dict[str, str] = {}  # collection -> the node that acknowledged this client's last delete
        self._after: dict[str, int] = {}  # collection -> the revision its reads name, since the pin ended
        self._rng = random.Random()

    # ------------------------------------------------------------- members

    def members(self) -> dict[str, str]:
        """The live members now (node id -> address), read from etcd."""
        entries, _ = self._kv.get_prefix(self.etcd.key("members", ""))
        self._members = {m.node_id: m.address for m in map(Member.from_entry, entries) if m.address}
        return dict(self._members)

    def _pick(self, tried: list[str]) -> str:
        """A member's address not in ``tried`` (members re-read first if
        anything failed): ``prefer`` if it is one, else at random."""
        if tried or not self._members:
            self.members()
        left = {node: address for node, address in self._members.items() if address not in tried}
        if not left:
            raise Unavailable(f"cluster {self.url}: no member left to try (members: "
                              f"{', '.join(sorted(self._members)) or 'none'}; failed: {', '.join(tried) or 'none'})")
        if self.prefer in left:
            return left[self.prefer]
        return left[self._rng.choice(sorted(left))]

    def _client(self, address: str) -> NodeClient:
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = NodeClient(address, **self.options)
        return client

    def _drop(self, address: str) -> None:
        """Forget a node that failed (its connection, and any role it was cached for)."""
        client = self._clients.pop(address, None)
        if client is not None:
            client.close()
        if self._reader == address:
            self._reader = None
        self._deleted_at = {name: a for name, a in self._deleted_at.items() if a != address}
        self._writers = {name: a for name, a in self._writers.items() if a != address}

    # --------------------------------------------------------------- reads

    def _read(self, call: Callable[[StoreClient], T], name: str | None = None) -> T:
        """``call`` on the reading node (for collection ``name``, the node that acknowledged this client's
        last delete in it, if any: module docstring), repeated on another after a failure of that node."""
        tried: list[str] = []
        while True:
            first = self._deleted_at.get(name, self._reader) if name is not None else self._reader
            address = first if first is not None and not tried else self._pick(tried)
            client = self._client(address)
            client.after = self._after.get(name, 0) if name is not None else 0
            client.answer = {}  # (a call other than a search or get leaves it so)
            try:
                result = call(client)
            except Unavailable:
                tried.append(address)
                self._drop(address)
                if len(tried) >= self.attempts:
                    raise
                continue
            if name is not None and self._deleted_at.get(name) == address:
                self._unpin(name, client.answer)
            elif name not in self._deleted_at:
                self._reader = address
            return result

    def _unpin(self, name: str, answer: dict[str, Any]) -> None:
        """End the pin of ``name`` once the pinned node's reply says it holds
        none of its acknowledged deletes (module docstring); a reply without
        those fields (collection_info, or a node before them) keeps it."""
        revision = answer.get("state_revision")
        if isinstance(revision, int) and not answer.get("held_deletes"):
            del self._deleted_at[name]
            self._after[name] = max(self._after.get(name, 0), revision)

    # -------------------------------------------------------------- writes

    def _writer(self, name: str) -> str | None:
        """The collection's writer's address, cached; None if etcd names none (or its node is not a member)."""
        if name in self._writers:
            return self._writers[name]
        try:
            found = self._kv.get(self.etcd.key("writers", name))
        except CoordinationError:
            return None  # any member forwards
        if found is None:
            return None
        node = Writer.from_entry(name, found).node_id
        address = self._members.get(node) or self.members().get(node)
        if address is not None:
            self._writers[name] = address
        return address

    def _write(self, name: str, call: Callable[[StoreClient], T]) -> tuple[T, str]:
        """``call`` on the writer of ``name`` (or a node that forwards it), and the address of the node
        that answered it; module docstring."""
        tried: list[str] = []
        named: str | None = None  # where a WriterElsewhere sent us
        cached = self._writer(name)
        while True:
            address = named or (cached if cached is not None and not tried else self._pick(tried))
            cached_hit = address == self._writers.get(name)
            try:
                result = call(self._client(address))
            except WriterElsewhere as e:  # nothing was written; the role moved
                self._writers.pop(name, None)
                if named is not None or e.address is None:
                    raise
                named = e.address
                continue
            except ServiceError as e:
                if not _not_applied(e):
                    raise  # the node's answer, or a lost connection: the write may have applied
                tried.append(address)
                self._drop(address)
                named = None
                if len(tried) >= self.attempts:
                    raise
                continue
            if not cached_hit:  # a forwarding node, or a new writer: learn who writes it now
                self._writers.pop(name, None)
                self._writer(name)
            return result, address

    # ------------------------------------------------- StoreClient's methods

    def create_collection(self, name: str, dim: int, metric: str = "l2", index: str = "flat") -> dict[str, Any]:
        return self._read(lambda c: c.create_collection(name, dim, metric, index))

    def collections(self) -> list[str]:
        return self._read(lambda c: c.collections())

    def collection_info(self, name: str) -> dict[str, Any]:
        return self._read(lambda c: c.collection_info(name), name)

    def append(self, name: str, vectors: Any, ids: Any, durable: bool = False, timeout: Timeout = ...) -> np.ndarray:
        """Append float32 [n, dim] vectors with int64 [n] ids on the collection's writer; one ref per row."""
        return self._write(name, lambda c: c.append(name, vectors, ids, durable, timeout))[0]

    def delete(self, name: str, refs: Any, durable: bool = False, timeout: Timeout = ...) -> int:
        """Delete by ref on the collection's writer; this client's next reads of it see it (module docstring)."""
        deleted, self._deleted_at[name] = self._write(name, lambda c: c.delete(name, refs, durable, timeout))
        return deleted

    def delete_ids(self, name: str, ids: Any, durable: bool = False, timeout: Timeout = ...) -> int:
        """Delete by id on the collection's writer; this client's next reads of it see it (module docstring)."""
        deleted, self._deleted_at[name] = self._write(name, lambda c: c.delete_ids(name, ids, durable, timeout))
        return deleted

    def compact(self, name: str | None = None, timeout: Timeout = None) -> int:
        """Store.compact on the collection's writer (or the reading node); rewrites are off in cluster mode."""
        address = (self._writer(name) if name is not None else None) or self._reader or self._pick([])
        return self._client(address).compact(name, timeout)

    def search(self, name: str, queries: Any, k: int = 10, params: dict[str, int] | None = None,
               timeout: Timeout = ...) -> SearchResult:
        """StoreClient.search on the reading node (which fans out across the cluster)."""
        return self._read(lambda c: c.search(name, queries, k, params, timeout), name)

    def get(self, name: str, refs: Any, timeout: Timeout = ...) -> np.ndarray:
        return self._read(lambda c: c.get(name, refs, timeout), name)

    def ids(self, name: str, refs: Any, timeout: Timeout = ...) -> np.ndarray:
        return self._read(lambda c: c.ids(name, refs, timeout), name)

    def flush(self) -> None:
        """Make durable every write this client made: a flush on each node it is connected to."""
        for client in list(self._clients.values()):
            client.flush()

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        self._kv.close()

    def __enter__(self) -> ClusterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
