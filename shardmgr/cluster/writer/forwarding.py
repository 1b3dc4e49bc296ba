"""Forwarded writes: a node that is not a collection's writer sends an
append or delete on to the writer and answers with the writer's answer
(docs/cluster.md, "Forwarded writes and connect_cluster").

The rules, for ``shardmgr.append``, ``shardmgr.delete`` and
``shardmgr.delete_ids``:

- The local store is asked first, so the writer rule (roles.py) decides: a
  node that holds the role, or wins it because no one held it, writes
  locally as before. Only a refusal with WriterElsewhere is forwarded.
- The forwarded request is the same command with the same arguments
  (``durable`` included) and binary parts, plus ``forwarded: true``. It
  goes to the address the refusal named (the writer's member key).
- **One hop.** A request that carries ``forwarded: true`` is never
  forwarded again: a node that is not the writer of it refuses it with
  WriterElsewhere (the role moved while it was on its way), and that
  refusal is what the first node answers. No request can loop while roles
  move.
- A delete, forwarded or not, is refused with DeletesBacklog (retryable,
  nothing written) while this node holds ``max_held_deletes`` rows of
  acknowledged deletes that other nodes' searches may not skip yet
  (acked_deletes.py), on the forwarding node and on the writer alike.
- The writer's reply (refs, counts) is this node's reply. To a forwarded
  delete the writer also lists the rows it deleted in its sealed shards and
  what will publish them (acked_deletes.py); this node holds them before it
  answers, so its own next search skips them, and passes on the rest. An error the
  writer answers passes through with its code and message unchanged,
  except a refusal of this node's credentials (``unauthenticated``,
  ``forbidden``, ``tls_failed``), which becomes ForwardDenied: the client's
  own token was accepted here, so that error would mislead it.
- A writer that cannot be reached becomes WriterUnreachable (an
  ``unavailable``: retry), naming the address and saying whether the write
  may have applied: not if the connection could not be made, or the writer
  answered ``unavailable`` (stopping: it applied nothing); maybe if the
  request was sent and the connection then broke or timed out.

Credentials: the writer checks this node like any client. With tokens on
(``--auth-file``), every node's process needs ``SHARDMGR_NODE_TOKEN``: a
token with the ``read`` and ``write`` roles that every node's tokens file
accepts (``read``: the searches and gets a node asks of the others, which
use the same credentials: query.py). It is read once, at start. With ``forward_ca`` (the ``[node]`` table) forwards
use TLS, checking the writer's certificate against that CA and its host
name; ``forward_cert``/``forward_key`` are presented to writers that
require client certificates. Without ``forward_ca`` (or a certificate)
forwards are plain TCP, and a writer that serves TLS cannot be reached.

Threads: :meth:`Forwarder.handle` runs on connection threads, many at
once. Each forward borrows a connection to the writer from the
forwarder's own :class:`Peers` pool (peers.py: one thread per connection
at a time; a connection whose call failed is closed, not reused); the
counters are under ``_lock``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from common.wire.client import MAX_CLIENT_SECONDS, ConnectionLost, Reply, RpcClient, TlsFailed
from common.wire.component import Request
from common.wire.errors import Forbidden, ServiceError, Unauthenticated, Unavailable
from common.wire.tls import client_context
from shardmgr.cluster.config import NodeConfig
from shardmgr.cluster.errors import ForwardDenied, WriterElsewhere, WriterUnreachable
from shardmgr.cluster.peers import Peers
from shardmgr.cluster.published import acked_deletes
from shardmgr.store import APPEND_BYTES_PER_SECOND

log = logging.getLogger(__name__)

TOKEN_ENV = "SHARDMGR_NODE_TOKEN"
"""The environment variable holding the token a node presents to the writer it forwards to."""

FORWARDED = "forwarded"
"""The argument that marks a forwarded request (it is never forwarded again)."""

DELETES = frozenset({"shardmgr.delete", "shardmgr.delete_ids"})
COMMANDS = frozenset({"shardmgr.append", *DELETES})
"""The commands a node forwards to the collection's writer."""

CONNECT_TIMEOUT_S = 2.0
"""Longest a forward waits to connect (and authenticate) to the writer: a live writer answers in milliseconds."""

_DENIED = (Unauthenticated, Forbidden, TlsFailed)


class Forwarder:
    """Forwards the writes this node is refused to their writer (module docstring)."""

    commands = COMMANDS

    def __init__(self, node: NodeConfig, node_id: str, token: str | None = None,
                 acked: acked_deletes.AckedDeletes | None = None) -> None:
        """``token``: what this node presents to writers; default ``$SHARDMGR_NODE_TOKEN`` (none if unset);
        ``acked``: where this node holds the deletes it acknowledges (acked_deletes.py)."""
        self.timeout_s = node.forward_timeout_s
        self.node_id = node_id
        self.acked = acked if acked is not None else acked_deletes.AckedDeletes()
        self.token = (token if token is not None else os.environ.get(TOKEN_ENV)) or ""
        tls = node.forward_ca is not None or node.forward_cert is not None
        #: built once (ValueError naming a file that cannot be loaded); None: plain TCP
        self.tls = client_context(node.forward_ca, node.forward_cert, node.forward_key) if tls else None
        self._peers = Peers(timeout=self.timeout_s, connect_timeout=min(CONNECT_TIMEOUT_S, self.timeout_s),
                            token=self.token, tls=self.tls or False)
        self._lock = threading.Lock()
        self.counters = {"writes_forwarded_total": 0, "forwards_failed_total": 0}

    def handle(self, request: Request, local: Callable[[Request], None]) -> None:
        """Serve ``request`` with ``local`` (the store's handler); if this node
        is not the writer and the request was not forwarded already, forward it.
        A delete is first admitted (acked_deletes.py: refused while this node
        holds too many acknowledged deletes, nothing written)."""
        if request.cmd in DELETES:
            self.acked.admit()
        try:
            local(request)
            return
        except WriterElsewhere as refused:
            if request.args.get(FORWARDED) is True:
                raise  # one hop only: the sender answers this refusal
            address = refused.address
            if address is None:  # its writer key outlives its member key by an instant, or it is rejoining
                with self._lock:
                    self.counters["forwards_failed_total"] += 1
                raise WriterUnreachable(f"{request.cmd}: node {self.node_id} could not forward this write: the "
                                        f"collection's writer is not a member just now (its lease is ending, or "
                                        f"it is rejoining); nothing was written; retry, writer_address=unknown"
                                        ) from refused
        reply = self._forward(address, request)
        if request.cmd not in DELETES:
            request.reply(reply.result, reply.parts)
            return
        self._hold(request, reply)
        request.reply({"deleted": reply.result["deleted"]})

    def deleted_parts(self, request: Request) -> dict[str, Any] | None:
        """What a delete this node wrote adds to its answer: for a forwarded
        one, the rows the forwarding node is to hold (acked_deletes.py)."""
        last = self.acked.last()
        if last is None or request.args.get(FORWARDED) is not True:
            return None
        return acked_deletes.encode(last[1])

    def _hold(self, request: Request, reply: Reply) -> None:
        """Hold what the writer's answer to a forwarded delete lists, before answering it."""
        try:
            held = acked_deletes.decode(reply.parts, str(reply.result.get("writer", "")))
        except ValueError as e:  # the delete is done: the rows are then seen as on any other node
            log.warning("%s forwarded to the writer: %s", request.cmd, e)
            return
        self.acked.hold(request.arg("name", str), held)

    def _forward(self, address: str, request: Request) -> Reply:
        """The writer's reply to ``request``, sent to ``address``; errors as the module docstring says."""
        with self._peers.client(address) as client:
            self._connect(client, address, request.cmd)
            with self._lock:
                self.counters["writes_forwarded_total"] += 1  # sent: the writer answers it, or may have
            return self._call(client, address, request)

    def _connect(self, client: RpcClient, address: str, cmd: str) -> None:
        """Connect now, so that a failure here is known to have sent nothing."""
        try:
            client.connect()
        except _DENIED as e:
            raise self._denied(address, cmd, e) from e
        except ServiceError as e:
            raise self._unreachable(address, cmd, f"could not connect ({e}); nothing was written") from e

    def _call(self, client: RpcClient, address: str, request: Request) -> Reply:
        args: dict[str, Any] = {**request.args, FORWARDED: True}
        size = sum(part.nbytes for part in request.parts.values())
        timeout = min(self.timeout_s + size / APPEND_BYTES_PER_SECOND, MAX_CLIENT_SECONDS)
        try:
            return client.call(request.cmd, args, request.parts, timeout=timeout)
        except ConnectionLost as e:  # includes TimedOut
            raise self._unreachable(address, request.cmd, f"the connection ended before its answer ({e}); the "
                                                          f"write may have applied: treat it as a lost reply") from e
        except _DENIED as e:
            raise self._denied(address, request.cmd, e) from e
        except ServiceError as e:
            if e.code == Unavailable.code:  # a goaway, or a reconnect that failed: nothing was applied
                raise self._unreachable(address, request.cmd, f"it is unavailable ({e}); nothing was "
                                                              "written") from e
            raise  # the writer's own answer, code and message unchanged

    def _unreachable(self, address: str, cmd: str, what: str) -> WriterUnreachable:
        with self._lock:
            self.counters["forwards_failed_total"] += 1
        log.warning("forwarding %s to the writer at %s failed: %s", cmd, address, what)
        return WriterUnreachable(f"{cmd}: node {self.node_id} could not forward this write to the collection's "
                                 f"writer: {what}; retry, writer_address={address}")

    def _denied(self, address: str, cmd: str, e: ServiceError) -> ForwardDenied:
        with self._lock:
            self.counters["forwards_failed_total"] += 1
        token = f"its ${TOKEN_ENV}" if self.token else f"no token (${TOKEN_ENV} is unset)"
        return ForwardDenied(f"{cmd}: the writer at {address} refused node {self.node_id}, which presented "
                             f"{token}: {e.code}: {e.message}; nothing was written (every node needs "
                             f"${TOKEN_ENV}, a token with the write role)")

    def close(self) -> None:
        """Close every idle connection; forwards still running close theirs when done."""
        self._peers.close()
