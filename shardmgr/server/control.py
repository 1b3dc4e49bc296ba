"""The server's own commands: ``info``, ``ping``, ``echo`` and ``stats``.

All run inline on the connection's thread; none touches stored data.

* ``info`` -> ``{server_version, protocol, max_frame_bytes, commands}``
* ``ping`` -> ``{}``
* ``echo`` -> the request's ``args`` and binary parts, unchanged
* ``stats`` -> ``{component: {counter: value}}`` (see Server.stats)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from common.wire import framing
from common.wire.component import Component, Request
from shardmgr import __version__

if TYPE_CHECKING:
    from .server import Server


class Control(Component):
    name = "server"

    def __init__(self, server: Server) -> None:
        self._server = server

    def commands(self) -> Iterable[str]:
        return ("info", "ping", "echo", "stats")

    def handle(self, request: Request) -> None:
        if request.cmd == "ping":
            request.reply()
        elif request.cmd == "echo":
            request.reply(request.args, dict(request.parts))
        elif request.cmd == "stats":
            request.reply(self._server.stats())
        else:
            request.reply({"server_version": __version__, "protocol": framing.PROTOCOL_VERSION,
                           "max_frame_bytes": self._server.config.max_frame_bytes,
                           "commands": self._server.command_names})
