"""etcd users and refusals: auth tokens shared by a process's etcd clients,
and which failures mean that etcd refused the credentials or the TLS.

etcd3gw speaks TLS (its session takes the CA and the client certificate)
but knows nothing of etcd's users; this module fills that gap. With a user
in EtcdSecurity, a client authenticates (``POST /v3/auth/authenticate``; the
password is read then, EtcdSecurity.read_password) and sends the token as
the ``Authorization`` header of every request.

Tokens end: etcd's simple tokens lapse after ``--auth-token-ttl`` (300 s by
default) unused, and all of them when etcd restarts; JWT tokens at their
expiry. etcd then answers "invalid auth token" (a new watch is cancelled as
"permission denied" instead). The client that sees it calls ``renew(stale)``
and repeats the request once: a new authentication runs only if no other
thread has replaced ``stale`` already, so an expiry costs one authentication
per process and user, not one per client. One authentication runs at a time
(each is a bcrypt check in etcd); the others wait for its token.
"""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Callable
from typing import Any

from shardmgr.cluster.config import EtcdSecurity

#: etcd's answers that mean "this token no longer holds; authenticate again"
STALE_TOKEN = ("invalid auth token", "revision of auth store is old")
#: OpenSSL's reasons for a handshake that cannot succeed with these settings (others, say an EOF, are transient)
REFUSED_TLS = ("CERTIFICATE_VERIFY_FAILED", "WRONG_VERSION_NUMBER", "ALERT", "NO_CERTIFICATE", "UNKNOWN_CA")


class EtcdTokens:
    """The current token of one user on one etcd, for every client of this process."""

    def __init__(self) -> None:
        self._token: str | None = None
        self._lock = threading.Lock()
        #: authentications made (each one a new token)
        self.authentications = 0

    def current(self, login: Callable[[], str]) -> str:
        """The token, authenticating with ``login()`` if there is none yet."""
        with self._lock:
            if self._token is None:
                self._token = login()
                self.authentications += 1
            return self._token

    def renew(self, stale: str, login: Callable[[], str]) -> str:
        """A token other than ``stale``: a new one from ``login()`` unless another client got one already."""
        with self._lock:
            if self._token is None or self._token == stale:
                self._token = None  # if login fails, the next request authenticates again
                self._token = login()
                self.authentications += 1
            return self._token


_registry: dict[tuple[str, int, EtcdSecurity], EtcdTokens] = {}
_registry_lock = threading.Lock()


def tokens_for(host: str, port: int, security: EtcdSecurity) -> EtcdTokens:
    """The process's tokens for this etcd and these credentials (one EtcdTokens per distinct triple)."""
    with _registry_lock:
        return _registry.setdefault((host, port, security), EtcdTokens())


def etcd_message(detail: str | None) -> str:
    """etcd's own message in a gateway error body (its JSON ``message``), else the body as it is."""
    if not detail:
        return ""
    try:
        body: Any = json.loads(detail)
    except ValueError:
        return detail.strip()
    return str(body.get("message") or body.get("error") or detail) if isinstance(body, dict) else detail.strip()


def is_stale_token(message: str) -> bool:
    return any(text in message for text in STALE_TOKEN)


def refusal(message: str, user: str | None) -> str | None:
    """Why etcd refused these credentials, from its error ``message``, as
    one line for an operator; None if the error is something else."""
    if "authentication failed" in message:
        return f"authentication as etcd user {user!r} failed: wrong password or unknown user ({message})"
    if "authentication is not enabled" in message:
        return (f"etcd user {user!r} is set but etcd has authentication disabled: enable it in etcd "
                f"('etcdctl auth enable') or drop the user")
    if "permission denied" in message or "user name is empty" in message:
        who = f"etcd user {user!r} has no role granting these keys" if user else (
            "etcd has authentication enabled: give an etcd user (--etcd-user) and its password")
        return f"{who} ({message})"
    if "CommonName of client" in message:
        return ("etcd refuses HTTP-gateway requests from a client certificate with a Common Name while auth "
                "is enabled: issue the etcd client certificate without a CN (docs/security.md)")
    if "authentication handshake failed" in message:
        return ("etcd's gateway cannot reach its own gRPC port: with --client-cert-auth, etcd's server "
                f"certificate must also allow client authentication (extendedKeyUsage clientAuth) ({message})")
    if "HTTP request to an HTTPS server" in message:
        return "this etcd port speaks TLS: give --etcd-ca (or --etcd-tls for a CA the system trusts)"
    if is_stale_token(message):
        return f"etcd refused a fresh token of user {user!r} ({message})"
    return None


def tls_refusal(error: BaseException, security: EtcdSecurity) -> str | None:
    """Why the TLS handshake with etcd cannot succeed, if ``error`` (or
    what caused it) is such a handshake failure; None otherwise."""
    found = _ssl_error(error)
    if found is None:
        return None
    reason = str(getattr(found, "reason", None) or "")
    text = getattr(found, "verify_message", None) or reason or str(found)
    if isinstance(found, ssl.SSLCertVerificationError) or "VERIFY_FAILED" in reason:
        return (f"TLS: etcd's certificate was not accepted ({text}): check --etcd-ca and that the certificate "
                f"names this host")
    if reason == "WRONG_VERSION_NUMBER":
        return "TLS: etcd does not speak TLS on this port: drop the etcd TLS options or use etcd's TLS port"
    if any(r in reason for r in REFUSED_TLS):
        hint = ("its CA must have signed --etcd-cert" if security.cert is not None else
                "it wants a client certificate: give --etcd-cert and --etcd-key")
        return f"TLS: etcd refused the handshake ({text.lower().replace('_', ' ')}): {hint}"
    return None


def _ssl_error(error: BaseException) -> ssl.SSLError | None:
    """The ssl.SSLError somewhere under ``error`` (requests and urllib3 wrap it: reason, args, cause, context)."""
    seen: set[int] = set()
    todo: list[Any] = [error]
    while todo:
        item = todo.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, ssl.SSLError):
            return item
        if isinstance(item, BaseException):
            todo.extend((item.__cause__, item.__context__, getattr(item, "reason", None), *item.args))
    return None
