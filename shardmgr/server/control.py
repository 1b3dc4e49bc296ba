"""The server's own commands: ``info``, ``ping``, ``echo``, ``stats`` and ``snapshot``.

All run inline on the connection's thread; none changes stored data.

* ``info`` -> ``{server_version, protocol, max_frame_bytes, commands}``
* ``ping`` -> ``{}``
* ``echo`` -> the request's ``args`` and binary parts, unchanged
* ``stats`` -> ``{component: {counter: value}}`` (see Server.stats)
* ``snapshot`` ``{dest}`` -> ``{dest, seconds, paused_s, bytes_copied}``: a
  consistent copy of the data directory at one durable point, to the new
  directory ``dest`` on the server's machine (shardmgr/snapshots.py); admin
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from common.wire import framing
from common.wire.component import Component, Request
from common.wire.errors import BadRequest
from shardmgr import __version__

from .config import ServerConfig


class Host(Protocol):
    """What the control commands read of the server that hosts them (Server is one; this module is below it)."""

    @property
    def config(self) -> ServerConfig: ...
    @property
    def command_names(self) -> list[str]: ...
    @property
    def components(self) -> list[Component]: ...
    def stats(self) -> dict[str, dict[str, float | int]]: ...


class Control(Component):
    name = "server"

    def __init__(self, server: Host) -> None:
        self._server = server

    def commands(self) -> Iterable[str]:
        return ("info", "ping", "echo", "stats", "snapshot")

    def handle(self, request: Request) -> None:
        if request.cmd == "ping":
            request.reply()
        elif request.cmd == "echo":
            request.reply(request.args, dict(request.parts))
        elif request.cmd == "stats":
            request.reply(self._server.stats())
        elif request.cmd == "snapshot":
            request.reply(self._snapshot(request.arg("dest", str)))
        else:
            request.reply({"server_version": __version__, "protocol": framing.PROTOCOL_VERSION,
                           "max_frame_bytes": self._server.config.max_frame_bytes,
                           "commands": self._server.command_names})

    def _snapshot(self, dest: str) -> dict[str, Any]:
        from shardmgr.snapshots import take  # the store and the queue: only this command needs them
        from shardmgr.store.service import StoreService
        from workq.service import WorkqService

        stores = [c.store for c in self._server.components if isinstance(c, StoreService)]
        brokers = [c.broker for c in self._server.components if isinstance(c, WorkqService)]
        if not stores:
            raise BadRequest("snapshot: this server hosts no vector store")
        return take(dest, stores[0], brokers[0] if brokers else None)
