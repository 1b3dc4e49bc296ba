"""Protected mode: which addresses the server may listen on without tokens.

Like Redis' protected mode: the service port and the metrics port may bind
a non-loopback address only if the server has a tokens file
(``auth_file``), or if the operator says ``insecure`` (then every start
logs a warning). A host name counts as loopback only if every address it
resolves to is a loopback address; ``""``, ``0.0.0.0`` and ``::`` are every
interface.
"""

from __future__ import annotations

from common.wire.hosts import is_loopback

__all__ = ["exposed", "is_loopback", "refusal"]


def exposed(addresses: dict[str, str]) -> list[str]:
    """The ``name=host`` entries of ``addresses`` that are not loopback."""
    return [f"{name}={host!r}" for name, host in addresses.items() if not is_loopback(host)]


def refusal(addresses: dict[str, str], has_tokens: bool, insecure: bool) -> str | None:
    """Why the server must not start (None if it may)."""
    found = exposed(addresses)
    if not found or has_tokens or insecure:
        return None
    return (f"protected mode: refusing to listen on {', '.join(found)} (not loopback) without a tokens "
            f"file. Anyone who can reach the port could read, write and delete data. Create a token with "
            f"'shardmgr token create NAME --roles ...' and start with --auth-file FILE, or bind 127.0.0.1, "
            f"or pass --insecure to accept the risk (see docs/security.md)")
