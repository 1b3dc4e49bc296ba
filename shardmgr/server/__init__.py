"""The service process that hosts the work queue and the vector store on one
port: ``shardmgr serve``.

Owns the server's configuration (``config``), the server and its start-up
and stop order (``server``), the listening socket and the connections it
admits (``acceptor``), one connection's reader thread and, once needed, its writer
thread (``connection``), the server's own commands (``control``), Prometheus
metrics (``metrics``) and who may read them (``http_auth``), the readiness
file (``readiness``), tokens and the command-to-role table (``auth``) and
protected mode (``exposure``).

Exports (``__all__``, each loaded on first use): ``Server`` and ``ServerConfig``.

May import: ``common``, ``workq`` (its service component), ``shardmgr.store``;
never ``shardmgr.verification``.
"""

from typing import TYPE_CHECKING

from common import exports

if TYPE_CHECKING:
    from .config import ServerConfig
    from .server import Server

__all__ = ["Server", "ServerConfig"]

__getattr__ = exports.lazy(__name__, {"Server": "server", "ServerConfig": "config"})
