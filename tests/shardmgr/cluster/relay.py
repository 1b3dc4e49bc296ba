"""A TCP relay on loopback that a test can cut: a node given its address as
its S3 endpoint reaches the real SeaweedFS through it while it is up, and
gets "connection refused" (a real network failure, fast) once it is cut,
while every other test keeps using the same SeaweedFS.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Relay:
    """Relays connections to 127.0.0.1:``target`` from a port of its own, until :meth:`cut`."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.port = 0
        self._listen()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), name="relay", daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed by cut()
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open |= {client, server}
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Refuse new connections and break the open ones."""
        if self._listener is not None:
            with contextlib.suppress(OSError):  # wakes the accept (a close alone does not, on Linux)
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._open.clear()

    def restore(self) -> None:
        """Relay again, on the same port."""
        if self._listener is None:
            self._listen()

    def close(self) -> None:
        self.cut()
