"""A watch on every key under an etcd prefix that survives dropped streams.

etcd3gw's own watch loses errors in a thread pool and never reconnects, and
its iterator then blocks forever: a node would stop seeing members leave
without knowing. This watch speaks the gateway's stream directly
(``POST /v3/watch``, one JSON message per line) on its own thread and
connection.

Guarantees: ``on_event`` is called on the watch thread, one event at a time,
in revision order, for every change from ``start_revision`` on. If the
stream drops (etcd restarted, network cut), the watch reconnects with
growing pauses (0.1 s to 2 s) and resumes from the revision after the last
one delivered, so nothing is missed or repeated; ``connected`` is clear
while it is down. If etcd has compacted that revision away, events were
lost: ``on_reset`` is called (the consumer must read the state again) and
the watch goes on from the oldest revision etcd still has. ``stop()`` ends
it within a bounded time.

With TLS and an etcd user (EtcdSecurity) the stream is HTTPS and carries
the process's token (etcd_auth.py). A stream already open outlives its
token; a new one etcd cancels as "permission denied" when the token has
expired (or etcd restarted): the watch gets a new token and reconnects.
If a fresh token is refused too, the user lacks the permission: that is
logged as an error, and the watch goes on trying (a fix of the user's
roles in etcd takes effect without a restart).

Not detected: an etcd that hangs without closing the stream (SIGSTOP) keeps
``connected`` set and delivers nothing until it resumes; the node's lease
(lease.py) is what notices a hung etcd.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any, Literal

from common.wire import tls
from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import CoordinationError
from shardmgr.cluster.state.kv import Entry, Kv, encode, entry, prefix_end

log = logging.getLogger(__name__)

MIN_PAUSE_S = 0.1
MAX_PAUSE_S = 2.0


class StaleToken(Exception):
    """etcd cancelled a new watch for want of permission: its token may have expired."""


@dataclasses.dataclass(frozen=True, slots=True)
class WatchEvent:
    """A change of one key. A DELETE's entry has the key and the deleting
    revision (``mod_revision``) only: empty value, zero create_revision."""

    kind: Literal["PUT", "DELETE"]
    entry: Entry


class PrefixWatch:
    """Calls ``on_event(WatchEvent)`` for every change under ``prefix``. ``start()`` begins."""

    def __init__(self, config: ClusterConfig, prefix: str, on_event: Callable[[WatchEvent], None], *,
                 start_revision: int, on_reset: Callable[[], None] | None = None, name: str = "watch") -> None:
        self.config = config
        self.prefix = prefix
        self.on_event = on_event
        self.on_reset = on_reset
        self.name = name
        #: the next revision to deliver
        self.next_revision = start_revision
        #: set while a stream is open
        self.connected = threading.Event()
        self._stop = threading.Event()
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"watch-{name}", daemon=True)
        #: the watch thread's own etcd client: it authenticates (the token is the process's) and holds no stream
        self._kv = Kv(config)
        security = config.etcd_security
        self._tls: ssl.SSLContext | None = (tls.client_context(security.ca, security.cert, security.key)
                                            if security.uses_tls else None)
        self._token: str | None = None  # the token the last stream was opened with
        self._fresh = False  # ... which was just renewed, and no watch created with it yet

    def start(self) -> PrefixWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the watch: no event is delivered after this returns (unless
        called from ``on_event`` itself, which ends it after that event)."""
        self._stop.set()
        with self._lock:
            if self._conn is not None and self._conn.sock is not None:
                with contextlib.suppress(OSError):  # wakes the thread blocked reading the stream
                    self._conn.sock.shutdown(socket.SHUT_RDWR)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.config.etcd_timeout_s + MAX_PAUSE_S + 1)
        if not self._thread.is_alive():
            self._kv.close()

    def _run(self) -> None:
        pause = MIN_PAUSE_S
        while not self._stop.is_set():
            try:
                if self._stream():
                    pause = MIN_PAUSE_S  # the stream was up: retry soon
            except StaleToken as e:
                self._renew(e)
            except (OSError, http.client.HTTPException, ValueError, KeyError, CoordinationError) as e:
                log.warning("watch %s on etcd %s:%d dropped (resuming from revision %d): %s", self.prefix,
                            self.config.etcd_host, self.config.etcd_port, self.next_revision, e)
            finally:
                self.connected.clear()
                self._close()
            if self._stop.wait(pause):
                return
            pause = min(pause * 2, MAX_PAUSE_S)

    def _renew(self, cause: StaleToken) -> None:
        """After a new watch was refused for want of permission: a new token (the old one may have expired)."""
        if self._token is None:
            log.error("watch %s on etcd %s:%d refused: %s (etcd has authentication enabled: give an etcd user)",
                      self.prefix, self.config.etcd_host, self.config.etcd_port, cause)
            return
        if self._fresh:  # a token just renewed was refused too: the user's roles do not cover the prefix
            log.error("watch %s on etcd %s:%d refused to etcd user %r with a new token: %s (its roles must grant "
                      "read on the prefix)", self.prefix, self.config.etcd_host, self.config.etcd_port,
                      self.config.etcd_security.user, cause)
        try:
            self._token = self._kv.renew_token(self._token)
        except CoordinationError as e:
            log.warning("watch %s: could not get a new etcd token: %s", self.prefix, e)
            return
        self._fresh = True

    def _stream(self) -> bool:
        """One stream, until it ends; True if it was created."""
        host, port, timeout = self.config.etcd_host, self.config.etcd_port, self.config.etcd_timeout_s
        self._token = self._kv.token()  # the process's current one (None without a user)
        conn = (http.client.HTTPSConnection(host, port, timeout=timeout, context=self._tls) if self._tls is not None
                else http.client.HTTPConnection(host, port, timeout=timeout))
        with self._lock:
            if self._stop.is_set():
                return False
            self._conn = conn
        body = {"create_request": {"key": encode(self.prefix), "range_end": prefix_end(self.prefix),
                                   "start_revision": self.next_revision}}
        headers = {"Content-Type": "application/json", **({"Authorization": self._token} if self._token else {})}
        conn.request("POST", "/v3/watch", body=json.dumps(body), headers=headers)
        response = conn.getresponse()
        if response.status != 200:
            raise http.client.HTTPException(f"watch answered HTTP {response.status}: {response.read(500)!r}")
        assert conn.sock is not None
        conn.sock.settimeout(None)  # quiet streams are normal; stop() shuts the socket to wake us
        created = False
        while not self._stop.is_set():
            line = response.readline()
            if not line:
                return created  # the stream ended (etcd went away, or stop())
            if line.strip():
                created = self._message(json.loads(line)) or created
        return created

    def _message(self, message: dict[str, Any]) -> bool:
        """Handle one stream message; True if it confirmed the watch's creation."""
        if "error" in message:
            raise ValueError(f"watch error: {message['error']}")
        result = message["result"]
        if result.get("canceled"):
            compacted = int(result.get("compact_revision", 0))
            if compacted:  # our revision is gone: events were lost; resume from what is left
                log.warning("watch %s: revision %d compacted, resuming from %d after a reset", self.prefix,
                            self.next_revision, compacted)
                self.next_revision = compacted
                if self.on_reset is not None:
                    self.on_reset()
            elif "permission denied" in result.get("cancel_reason", "").lower():
                raise StaleToken(result["cancel_reason"])
            raise ValueError(f"watch canceled: {result.get('cancel_reason', 'compacted')}")
        if result.get("created"):
            self._fresh = False
            self.connected.set()
            return True
        for event in result.get("events", []):
            if self._stop.is_set():
                return False
            kv = entry(event["kv"])
            # PUT is the enum's default, which the gateway's JSON leaves out
            kind: Literal["PUT", "DELETE"] = "DELETE" if event.get("type") == "DELETE" else "PUT"
            try:
                self.on_event(WatchEvent(kind=kind, entry=kv))
            except Exception:  # the consumer's bug must not end the watch for everyone after it
                log.exception("watch %s: on_event failed for %s %s", self.prefix, kind, kv.key)
            self.next_revision = kv.mod_revision + 1
        return False

    def _close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
