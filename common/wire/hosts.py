"""Which host names and addresses stay on this machine.

Shared by the server's protected mode (shardmgr/server/exposure.py: where
it may listen without tokens) and cluster mode's etcd access (which etcd it
may reach without TLS).
"""

from __future__ import annotations

import ipaddress
import socket


def is_loopback(host: str) -> bool:
    """True if ``host`` is reachable from this machine only: a loopback
    address, or a name every address of which is one (``localhost``).
    ``""``, ``0.0.0.0`` and ``::`` (every interface) and names that do not
    resolve are not."""
    if not host:
        return False
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass  # a name: look at what it resolves to
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)
