"""Tokens on the metrics port: who may read ``/metrics``, ``/cluster`` and
``/cluster.json`` (docs/security.md, "The metrics port").

Without a tokens file every path is open, as the service port is (protected
mode keeps both on loopback then). With one (``--auth-file``) every request
needs a token whose roles include ``read`` (or ``admin``): the pages show
what ``stats`` and ``collection_info`` show. Two exceptions: the login form
itself, and ``/metrics`` when ``metrics_open`` is set (for scrapers that
cannot send a token).

A request presents its token in one of two ways, never in the URL (a query
string lands in access logs, proxies' logs and the browser's history: a
``?token=`` is ignored like any other query):

- ``Authorization: Bearer TOKEN``, for programs (Prometheus's
  ``authorization: {credentials_file: ...}``, ``curl -H``).
- a session cookie, for browsers. A request without a token from a client
  that accepts HTML gets the login form (status 401); the form posts the
  token to ``/login``, which answers 303 to the page asked for, setting
  ``shardmgr_session_<PORT>`` (session_cookie: the port in the name, since
  browsers scope cookies by host, not port, and every node on one machine
  would otherwise replace the others' cookie): 256 random bits,
  ``HttpOnly`` (the page's script cannot read it), ``SameSite=Strict`` (no
  other site's page sends it; services on the same host's other ports do
  receive it: docs/security.md), ``Max-Age`` SESSION_S. A session lives in
  this process's memory only (a restart ends them all; at most
  MAX_SESSIONS, the oldest dropped first) and holds the token's hash, not
  the token: each request checks that hash against the tokens file as it
  is then, so revoking a token ends its sessions at once. ``POST /logout``
  ends one.

The Cookie header is read by hand (cookie_values), not with
``http.cookies``, which drops every cookie of a header holding one value it
cannot parse (``theme=dark mode``, ``prefs={"a":1}``: what another web app
on the same host name may set); several cookies of the session's name (set
with other paths or domains) are each tried.

Tokens compare in constant time (auth.Authenticator); a session is found by
the SHA-256 of its id, so the lookup's time says nothing about the id. Every
request refused (401: no valid token; 403: a token without ``read``) counts
in the server's ``errors_unauthenticated_total`` or ``errors_forbidden_total``,
as refused requests on the service port do; a token presented and refused
is logged with the peer's address, never with the token.

Threads: requests run on the HTTP server's threads; ``_lock`` guards the sessions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import html
import json
import logging
import re
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

from .auth import READ, Authenticator, Principal

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

SESSION_COOKIE = "shardmgr_session"
"""The session cookie's name, before the port (session_cookie)."""
SESSION_S = 12 * 3600
"""How long a login lasts, in seconds (the cookie's ``Max-Age`` and the session's life)."""
MAX_SESSIONS = 1024
"""Sessions kept at once; a login beyond it ends the oldest."""
MAX_LOGIN_BYTES = 4096
"""Largest login form body read: a peer without a token cannot make the server buffer more."""
LOGIN_PATH, LOGOUT_PATH, METRICS_PATH = "/login", "/logout", "/metrics"
DEFAULT_NEXT = "/cluster"
"""Where a login goes when the form does not say (or names something that is not a path here)."""
_NEXT = re.compile(r"/(?!/)[A-Za-z0-9._~/-]*")  # a path on this server: no scheme, host, query or "//"

#: the login page loads nothing and runs no script; it may post only to this server
LOGIN_HEADERS = [("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"),
                 ("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                                             "frame-ancestors 'none'")]
CHALLENGE = ("WWW-Authenticate", 'Bearer realm="shardmgr"')

LOGIN_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>shardmgr: log in</title>
<style>
  body { margin: 0; font: 14px/1.45 system-ui, sans-serif; color: #1d2330; background: #f7f8fa; }
  form { max-width: 420px; margin: 80px auto; padding: 24px; background: #fff; border: 1px solid #e4e7ec;
         border-radius: 8px; }
  h1 { font-size: 18px; margin: 0 0 12px; }
  input[type=password] { width: 100%; padding: 8px; margin: 8px 0 12px; font: 13px ui-monospace, monospace; }
  .message { color: #c4320a; font-weight: 600; }
  .muted { color: #667085; font-size: 12px; }
</style>
</head>
<body>
<form method="post" action="/login">
  <h1>shardmgr</h1>
  <p class="message" id="message">@MESSAGE@</p>
  <label for="token">Token (a tokens-file token with the read role)</label>
  <input type="password" id="token" name="token" autocomplete="off" required autofocus>
  <input type="hidden" name="next" value="@NEXT@">
  <button type="submit">Log in</button>
  <p class="muted">Programs send <code>Authorization: Bearer TOKEN</code> instead.</p>
</form>
</body>
</html>
"""


@dataclasses.dataclass(frozen=True, slots=True)
class _Session:
    digest: bytes = dataclasses.field(repr=False)  # the token's SHA-256: in no repr
    expires: float  # time.monotonic()


class HttpAuth:
    """A WSGI app that lets a request through to ``app`` only with a token allowed to read (module docstring)."""

    def __init__(self, app: WsgiApp, auth: Authenticator, *, port: int, metrics_open: bool = False,
                 count_error: Callable[[str], None] | None = None) -> None:
        """``port``: the metrics port this app answers on, which names its cookie (session_cookie)."""
        self._app = app
        self._auth = auth
        self.cookie = session_cookie(port)
        self.metrics_open = metrics_open
        self._count_error = count_error or (lambda code: None)
        self._lock = threading.Lock()
        self._sessions: dict[bytes, _Session] = {}  # SHA-256 of the session id -> session; oldest first

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")
        if path == LOGIN_PATH:
            if method == "POST":
                return self._login(environ, start_response)
            return _form(start_response, "200 OK", "", DEFAULT_NEXT)
        if path == LOGOUT_PATH and method == "POST":
            return self._logout(environ, start_response)
        if path == METRICS_PATH and self.metrics_open:
            return self._app(environ, start_response)
        principal, presented = self._principal(environ)
        if principal is None:
            self._count_error("unauthenticated")
            if presented:
                log.warning("metrics port: refused %s from %s: it is not valid on this server", presented,
                            environ.get("REMOTE_ADDR", "?"))
            why = f"the {presented} is not valid here" if presented else ""
            return _refuse(environ, start_response, "401 Unauthorized",
                           "this page needs a token: log in (reload the page), or send 'Authorization: Bearer "
                           "TOKEN'" + (f"; {why}" if why else ""), why)
        if not principal.has(READ):
            self._count_error("forbidden")
            return _refuse(environ, start_response, "403 Forbidden", _lacks_read(principal), _lacks_read(principal))
        return self._app(environ, start_response)

    # ---------------------------------------------------------------- checks

    def _principal(self, environ: dict[str, Any]) -> tuple[Principal | None, str]:
        """Who the request is, and what it presented that deserves a log line if refused ("" for nothing
        of the kind: no token, or a session that ended)."""
        header = environ.get("HTTP_AUTHORIZATION")
        if header is not None:
            scheme, _, token = header.strip().partition(" ")
            if scheme.lower() != "bearer":
                return None, "Authorization header (only 'Bearer TOKEN' is taken)"
            return self._auth.authenticate(token.strip()), "bearer token"
        now = time.monotonic()
        for key in self._session_keys(environ):  # a stale one (another path's, a restart's) may come first
            with self._lock:
                session = self._sessions.get(key)
                if session is not None and session.expires <= now:
                    del self._sessions[key]
                    session = None
            principal = self._auth.by_digest(session.digest) if session is not None else None
            if principal is not None:
                return principal, ""
        return None, ""

    def _session_keys(self, environ: dict[str, Any]) -> list[bytes]:
        """The SHA-256 of each value of this server's session cookie in the request, in the header's order."""
        return [hashlib.sha256(value.encode()).digest()
                for value in cookie_values(environ.get("HTTP_COOKIE", ""), self.cookie) if value]

    # --------------------------------------------------------- login, logout

    def _login(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_LOGIN_BYTES:
            return answer(start_response, "413 Content Too Large", "text/plain; charset=utf-8",
                           f"a login form is at most {MAX_LOGIN_BYTES} bytes\n".encode())
        try:
            fields = urllib.parse.parse_qs(environ["wsgi.input"].read(length).decode("utf-8", "replace"),
                                           max_num_fields=4)
        except ValueError:
            fields = {}
        token = (fields.get("token") or [""])[0].strip()
        wanted = (fields.get("next") or [DEFAULT_NEXT])[0]
        next_path = wanted if _NEXT.fullmatch(wanted) and wanted not in (LOGIN_PATH, LOGOUT_PATH) else DEFAULT_NEXT
        principal = self._auth.authenticate(token) if token else None
        if principal is None:
            self._count_error("unauthenticated")
            if token:
                log.warning("metrics port: refused a login from %s: the token is not valid on this server",
                            environ.get("REMOTE_ADDR", "?"))
            return _form(start_response, "401 Unauthorized",
                         "That token is not valid on this server." if token else "Give a token.", next_path)
        if not principal.has(READ):
            self._count_error("forbidden")
            return _form(start_response, "403 Forbidden", _lacks_read(principal) + ".", next_path)
        session_id = secrets.token_urlsafe(32)
        self._add(hashlib.sha256(session_id.encode()).digest(), hashlib.sha256(token.encode()).digest())
        log.info("metrics port: %s logged in as %s", environ.get("REMOTE_ADDR", "?"), principal.name)
        cookie = f"{self.cookie}={session_id}; Path=/; Max-Age={SESSION_S}; HttpOnly; SameSite=Strict"
        return answer(start_response, "303 See Other", "text/plain; charset=utf-8", b"logged in\n",
                       [("Location", next_path), ("Set-Cookie", cookie), ("Cache-Control", "no-store")])

    def _add(self, key: bytes, digest: bytes) -> None:
        now = time.monotonic()
        with self._lock:
            for old in [k for k, s in self._sessions.items() if s.expires <= now]:
                del self._sessions[old]
            while len(self._sessions) >= MAX_SESSIONS:
                del self._sessions[next(iter(self._sessions))]
            self._sessions[key] = _Session(digest, now + SESSION_S)

    def _logout(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        with self._lock:
            for key in self._session_keys(environ):
                self._sessions.pop(key, None)
        return answer(start_response, "303 See Other", "text/plain; charset=utf-8", b"logged out\n",
                       [("Location", LOGIN_PATH), ("Cache-Control", "no-store"),
                        ("Set-Cookie", f"{self.cookie}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict")])


def session_cookie(port: int) -> str:
    """The session cookie's name on metrics port ``port``. The port, not a
    random tag per process: a restarted server on the same port has no
    sessions anyway (its browser's old cookie is refused, then replaced at
    the next login, not piled up beside it)."""
    return f"{SESSION_COOKIE}_{port}"


def cookie_values(header: str, name: str) -> list[str]:
    """The values of every cookie called ``name`` in a Cookie header, in order
    (RFC 6265: ``name=value`` pairs split by ``;``; a value in double quotes
    loses them). Any other cookie, well formed or not, is skipped."""
    found = []
    for pair in header.split(";"):
        key, equals, value = pair.strip().partition("=")
        if equals and key.strip() == name:
            value = value.strip()
            found.append(value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value)
    return found


def _lacks_read(principal: Principal) -> str:
    return (f"token {principal.name!r} has {', '.join(sorted(principal.roles))}; these pages need role "
            f"{READ!r} (or admin)")


def _refuse(environ: dict[str, Any], start_response: StartResponse, status: str, message: str,
            form_message: str) -> Iterable[bytes]:
    """``status`` with ``message``: as JSON for ``*.json``, as text to programs, as the login form (saying
    ``form_message``) to a browser."""
    path = environ.get("PATH_INFO", "")
    if path.endswith(".json"):
        return answer(start_response, status, "application/json", json.dumps({"error": message}).encode(),
                       [CHALLENGE, ("Cache-Control", "no-store")])
    if environ.get("REQUEST_METHOD", "GET") == "GET" and "text/html" in environ.get("HTTP_ACCEPT", ""):
        return _form(start_response, status, form_message, path if _NEXT.fullmatch(path) else DEFAULT_NEXT)
    return answer(start_response, status, "text/plain; charset=utf-8", f"{message}\n".encode(),
                   [CHALLENGE, ("Cache-Control", "no-store")])


def _form(start_response: StartResponse, status: str, message: str, next_path: str) -> list[bytes]:
    page = LOGIN_PAGE.replace("@MESSAGE@", html.escape(message)).replace("@NEXT@", html.escape(next_path))
    extra = [CHALLENGE] if not status.startswith("200") else []
    return answer(start_response, status, "text/html; charset=utf-8", page.encode(), [*LOGIN_HEADERS, *extra])


def answer(start_response: StartResponse, status: str, content_type: str, body: bytes,
           headers: list[tuple[str, str]] | None = None) -> list[bytes]:
    """Start a response of ``body`` with these headers; its body as a WSGI iterable."""
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body))), *(headers or [])])
    return [body]
