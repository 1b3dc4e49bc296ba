"""Connections from this node to the other nodes, pooled per address.

A wire client is used by one thread at a time, so each address has a small
pool of idle clients: a call borrows one (or dials a new one), and gives it
back when the call returned normally. A client whose call raised anything
(the peer's own errors included: a lost connection is one of them too) is
closed, not reused, so a dead peer's broken sockets never
stay in the pool. Peer calls never wait for a peer to come back
(``retry_for`` 0): the caller decides what to ask instead.

Threads: any; the pools are guarded by ``_lock``, the calls run unlocked.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from common.wire.client import RpcClient

MAX_IDLE = 8
"""Idle clients kept per peer address."""


class Peers:
    """Pooled wire clients to other nodes; ``options`` go to every RpcClient (token, tls, ...)."""

    def __init__(self, *, timeout: float = 30.0, connect_timeout: float = 2.0, **options: Any) -> None:
        self.options = {"timeout": timeout, "connect_timeout": connect_timeout, "retry_for": 0.0, **options}
        self._idle: dict[str, list[RpcClient]] = {}
        self._lock = threading.Lock()
        self._closed = False

    @contextlib.contextmanager
    def client(self, address: str) -> Iterator[RpcClient]:
        """A client of ``address`` for one call (or a few), returned to the pool after."""
        with self._lock:
            pool = self._idle.get(address)
            client = pool.pop() if pool else None
        if client is None:
            client = RpcClient(address, **self.options)
        try:
            yield client
        except BaseException:  # a lost connection is an error too (Unavailable): never reuse after one
            client.close()
            raise
        self._give_back(address, client)

    def _give_back(self, address: str, client: RpcClient) -> None:
        with self._lock:
            pool = self._idle.setdefault(address, [])
            if not self._closed and len(pool) < MAX_IDLE:
                pool.append(client)
                return
        client.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            clients = [c for pool in self._idle.values() for c in pool]
            self._idle.clear()
        for client in clients:
            client.close()
