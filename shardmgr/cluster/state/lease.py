"""A node's etcd lease, kept alive by a thread of its own.

A node holds one lease; its member key and any writer key it wins are
attached to it, so when the node dies (or stops answering) etcd deletes
them all once the TTL passes, and no one has to clean up after it.

Guarantees:

- The keepalive thread renews the lease every TTL/3 (a failed renewal is
  retried every TTL/6), each request bounded by ``etcd_timeout_s``.
- :meth:`NodeLease.alive` is False from the local deadline on: the moment a
  renewal was *sent* (not answered) plus the TTL it granted. etcd cannot
  expire the lease before that moment (its clock starts no earlier), so as
  long as the node's clock runs no slower than etcd's, a node that sees
  ``alive()`` True still holds its keys. This holds even if the keepalive
  thread is stuck or the whole process was paused: it is computed, not
  signalled. (It was true when checked: an act that follows the check can
  still land after the expiry, which is why shard-map changes are also
  fenced inside etcd: shard_map.py.)
- Loss is final and observable: when etcd says the lease is gone, or the
  deadline passes (seen by the keepalive thread, or by any ``alive()`` or
  ``check()``), ``lost`` is set and every ``on_lost`` callback runs once, on
  the thread that saw it. A node that lost its lease must stop acting on
  anything the lease guarded, and take a new lease to join again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import CoordinationDenied, CoordinationError, CoordinationUnavailable, LeaseLost
from shardmgr.cluster.state.kv import Kv

log = logging.getLogger(__name__)


class NodeLease:
    """One granted etcd lease and its keepalive thread. ``start()`` grants it."""

    def __init__(self, config: ClusterConfig, *, name: str = "") -> None:
        self.config = config
        self.name = name or "lease"
        self.id = 0
        self.ttl_s = config.lease_ttl_s
        #: set once the lease is known (or must be presumed) expired; never cleared
        self.lost = threading.Event()
        self._callbacks: list[Callable[[NodeLease], None]] = []
        self._deadline = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._kv = Kv(config)  # the keepalive thread's own session

    def start(self) -> NodeLease:
        """Grant the lease (TTL from the config) and start its keepalive thread."""
        sent = time.monotonic()
        self.id, self.ttl_s = self._kv.grant(self.config.lease_ttl_s)
        self._deadline = sent + self.ttl_s
        self._thread = threading.Thread(target=self._keep_alive, name=f"lease-{self.name}", daemon=True)
        self._thread.start()
        return self

    def on_lost(self, callback: Callable[[NodeLease], None]) -> None:
        """Run ``callback(lease)`` once when the lease is lost (at once if it already is)."""
        with self._lock:
            if not self.lost.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def alive(self) -> bool:
        """True while the lease surely holds: not lost, and before the local
        deadline (once past it, the lease is marked lost)."""
        if self.lost.is_set() or not self.id:
            return False
        if time.monotonic() < self._deadline:
            return True
        self._mark_lost("its deadline passed without a renewal")
        return False

    def check(self) -> None:
        """Raise LeaseLost unless ``alive()``."""
        if not self.alive():
            raise LeaseLost(f"lease {self.id:x} ({self.name}) on etcd {self._kv.endpoint} is lost or expired")

    def remaining_s(self) -> float:
        """Seconds until the local deadline (<= 0: presumed expired)."""
        return self._deadline - time.monotonic() if not self.lost.is_set() else 0.0

    def stop_keepalive(self) -> None:
        """Stop renewing without revoking: the lease runs out after its TTL,
        as if this process had been paused (tests use it to simulate SIGSTOP)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.config.etcd_timeout_s + 1)

    def close(self, *, revoke: bool = True) -> None:
        """Stop the keepalive and (by default) revoke the lease, deleting its
        keys at once; a revoke that fails leaves them to expire with the TTL.
        The lease counts as lost from here on."""
        self.stop_keepalive()
        if revoke and self.id and not self.lost.is_set():
            try:
                self._kv.revoke(self.id)
            except CoordinationUnavailable as e:
                log.warning("could not revoke lease %x, its keys expire in %d s: %s", self.id, self.ttl_s, e)
            except CoordinationError:  # etcd no longer has it: it expired, which is what revoking asks
                pass
        self._mark_lost("closed")
        self._kv.close()

    def _keep_alive(self) -> None:
        interval = self.ttl_s / 3
        wait = interval
        while not self._stop.wait(min(wait, max(self.remaining_s(), 0.0))):
            if time.monotonic() >= self._deadline:  # renewals failed for a whole TTL
                self._mark_lost("keepalives failed past the TTL")
                return
            sent = time.monotonic()
            try:
                ttl = self._kv.keepalive(self.id)
            except (CoordinationUnavailable, CoordinationDenied) as e:  # denied: a renewed token was refused
                log.warning("lease %x keepalive failed (%.1f s left): %s", self.id, self.remaining_s(), e)
                wait = interval / 2
                continue
            if ttl <= 0:
                self._mark_lost("etcd says it expired")
                return
            if time.monotonic() >= self._deadline:
                # The answer came after the local deadline: alive() has already said False, and a
                # node may have acted on it (stepped down). Keep loss final rather than flip back.
                self._mark_lost("a keepalive answered after the local deadline")
                return
            with self._lock:
                self._deadline = max(self._deadline, sent + ttl)
            wait = interval

    def _mark_lost(self, why: str) -> None:
        with self._lock:
            if self.lost.is_set():
                return
            self.lost.set()
            callbacks, self._callbacks = self._callbacks, []
        if why != "closed":
            log.warning("lease %x (%s) lost: %s", self.id, self.name, why)
        for callback in callbacks:
            try:
                callback(self)
            except Exception:  # a callback's failure must not stop the others
                log.exception("on_lost callback of lease %x failed", self.id)
