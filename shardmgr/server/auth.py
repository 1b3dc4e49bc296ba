"""Who may run which command: tokens, roles and the tokens file.

Every command the server serves needs one role (:data:`COMMAND_ROLES`, the
one table; docs/security.md shows it). A token carries a set of roles;
``admin`` implies every role. A command missing from the table needs
``admin`` (fail closed), and tests/shardmgr/server/test_auth.py fails if a
hosted command is missing.

The tokens file (``--auth-file``) has one token per line::

    # name      roles          hash of the token
    ingest      write,read     sha256:6f1c...  (64 hex digits)

Names are 1-64 of ``A-Z a-z 0-9 . _ @ -``; ``#`` starts a comment. The
file holds hashes only: a token is 32 random bytes, so an unsalted SHA-256
is enough (no dictionary or precomputed table can cover a 256-bit random
space, and a salt would only protect guessable secrets) and a stolen file
does not let anyone in. Tokens are compared by hash with
:func:`hmac.compare_digest` against every entry, so the time taken does not
depend on which bytes match.

The server re-reads the file when its size, mtime or inode changes (seen at
the next authentication), so a token is added or revoked without a restart;
a changed file that does not parse is logged and the previous tokens stay.
Connections already authenticated keep their roles until they close.

Threads: :class:`Authenticator` is called from every connection's reader
thread; ``_lock`` guards the loaded entries.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import os
import re
import secrets
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

READ, WRITE, WORKER, ADMIN = "read", "write", "worker", "admin"
ROLES: Final = (READ, WRITE, WORKER, ADMIN)
ANY: Final = "any"
"""Pseudo-role in :data:`COMMAND_ROLES`: any valid token may run the command."""

COMMAND_ROLES: dict[str, str] = {
    # the server's own (control.py)
    "info": ANY, "ping": ANY, "echo": ANY, "stats": READ, "snapshot": ADMIN, "shardmgr.compact": ADMIN,
    # the work queue (workq/service.py)
    "workq.enqueue": WRITE,
    "workq.results": READ, "workq.job_status": READ, "workq.stats": READ,
    "workq.hello": WORKER, "workq.lease": WORKER, "workq.complete": WORKER, "workq.release": WORKER,
    "workq.touch": WORKER,
    "workq.kick": ADMIN,
    # the vector store (shardmgr/store/service.py)
    "shardmgr.create_collection": WRITE, "shardmgr.append": WRITE, "shardmgr.flush": WRITE,
    "shardmgr.delete": WRITE, "shardmgr.delete_ids": WRITE,
    "shardmgr.collections": READ, "shardmgr.collection_info": READ, "shardmgr.search": READ,
    "shardmgr.get": READ, "shardmgr.search_shards": READ, "shardmgr.get_shards": READ, "shardmgr.report": READ,
}
"""The role each command needs. Commands not listed need ``admin``."""

MAX_AUTH_FRAME_BYTES: Final = 64 << 10
"""Largest frame a connection may send before it has authenticated: a peer
without a token cannot make the server buffer more than this."""

TOKEN_PREFIX: Final = "smt_"
HASH_PREFIX: Final = "sha256:"
_NAME: Final = re.compile(r"[A-Za-z0-9._@-]{1,64}")
_HASH: Final = re.compile(re.escape(HASH_PREFIX) + r"[0-9a-f]{64}")


class AuthFileError(ValueError):
    """The tokens file cannot be read or a line of it is malformed; the message names the line."""


@dataclasses.dataclass(frozen=True, slots=True)
class Principal:
    """Who a connection is: a token's name and roles."""

    name: str
    roles: frozenset[str]

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, name: str, roles: frozenset[str]) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "roles", roles)

    def may(self, cmd: str) -> bool:
        """True if these roles allow ``cmd``."""
        required = COMMAND_ROLES.get(cmd, ADMIN)
        return required == ANY or self.has(required)

    def has(self, role: str) -> bool:
        """True if these roles include ``role`` (``admin`` includes every role)."""
        return ADMIN in self.roles or role in self.roles


OPEN: Final = Principal("anonymous", frozenset({ADMIN}))
"""Every connection's principal when the server has no tokens file."""


@dataclasses.dataclass(frozen=True, slots=True)
class TokenEntry:
    """One line of the tokens file."""

    name: str
    roles: frozenset[str]
    digest: bytes = dataclasses.field(repr=False)  # sha256 of the token: in no repr, as no secret is

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, name: str, roles: frozenset[str], digest: bytes) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "roles", roles)
        object.__setattr__(self, "digest", digest)


def new_token() -> str:
    """A fresh token: a recognisable prefix and 32 random bytes, URL-safe base64."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The token's hash as written in the tokens file (``sha256:<hex>``)."""
    return HASH_PREFIX + hashlib.sha256(token.encode()).hexdigest()


def parse_roles(text: str) -> frozenset[str]:
    """``"read,write"`` to a set of roles; AuthFileError for unknown or no roles."""
    roles = frozenset(r.strip() for r in text.split(",") if r.strip())
    unknown = sorted(roles - set(ROLES))
    if unknown or not roles:
        raise AuthFileError(f"roles must be a comma-separated subset of {', '.join(ROLES)}; got {text!r}")
    return roles


def parse_tokens(text: str, source: str) -> list[TokenEntry]:
    """The entries of a tokens file's text; AuthFileError naming the first bad line."""
    entries: list[TokenEntry] = []
    names: set[str] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}, line {number}"
        fields = line.split()
        if len(fields) != 3:
            raise AuthFileError(f"{where}: expected 'NAME ROLES sha256:HEX', got {len(fields)} field(s)")
        name, roles, digest = fields
        if not _NAME.fullmatch(name):
            raise AuthFileError(f"{where}: token name {name!r} must be 1-64 of A-Z a-z 0-9 . _ @ -")
        if name in names:
            raise AuthFileError(f"{where}: token name {name!r} appears twice")
        if not _HASH.fullmatch(digest):
            hint = " (the file holds hashes, never tokens)" if digest.startswith(TOKEN_PREFIX) else ""
            raise AuthFileError(f"{where}: hash must be 'sha256:' and 64 lowercase hex digits{hint}")
        try:
            role_set = parse_roles(roles)
        except AuthFileError as exc:
            raise AuthFileError(f"{where}: {exc}") from None
        names.add(name)
        entries.append(TokenEntry(name, role_set, bytes.fromhex(digest[len(HASH_PREFIX):])))
    return entries


def load_tokens(path: Path) -> list[TokenEntry]:
    """The entries of the tokens file at ``path``; AuthFileError if unreadable or malformed."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthFileError(f"cannot read the tokens file {path}: {exc}") from exc
    return parse_tokens(text, str(path))


def add_token(path: Path, name: str, roles: Iterable[str]) -> str:
    """Append a new token's line to ``path`` (created with mode 0600) and
    return the token, which is stored nowhere. AuthFileError if the name is
    bad or taken, a role unknown, or the existing file malformed."""
    role_set = parse_roles(",".join(roles))
    if not _NAME.fullmatch(name):
        raise AuthFileError(f"token name {name!r} must be 1-64 of A-Z a-z 0-9 . _ @ -")
    existing = load_tokens(path) if path.exists() else []
    if any(entry.name == name for entry in existing):
        raise AuthFileError(f"{path} already has a token named {name!r}; choose another name to rotate")
    token = new_token()
    line = f"{name} {','.join(r for r in ROLES if r in role_set)} {hash_token(token)}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_size and not _ends_with_newline(path):
            line = "\n" + line
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return token


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


class Authenticator:
    """Checks tokens against a tokens file; without one, everyone is :data:`OPEN`."""

    def __init__(self, path: Path | None) -> None:
        """Loads the file now: AuthFileError (naming the line) if it is bad."""
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._entries: list[TokenEntry] = []
        if path is not None:
            self._entries = load_tokens(path)
            self._stamp = _stamp(path)

    @property
    def required(self) -> bool:
        """True if connections must authenticate."""
        return self.path is not None

    def authenticate(self, token: object) -> Principal | None:
        """The principal ``token`` stands for, or None if it matches no entry."""
        if self.path is None:
            return OPEN
        if not isinstance(token, str) or not token:
            return None
        return self.by_digest(hashlib.sha256(token.encode()).digest())

    def by_digest(self, digest: bytes) -> Principal | None:
        """The principal of the token whose SHA-256 is ``digest`` in the file
        as it is now (a session of the metrics port holds only the digest,
        so revoking the token ends it), or None; OPEN without a file."""
        if self.path is None:
            return OPEN
        found: TokenEntry | None = None
        for entry in self._current():  # no early exit: the time does not say which entry matched
            if hmac.compare_digest(entry.digest, digest):
                found = entry
        return Principal(found.name, found.roles) if found is not None else None

    def _current(self) -> list[TokenEntry]:
        """The entries, re-read first if the file changed."""
        assert self.path is not None
        try:
            stamp = _stamp(self.path)
        except OSError as exc:
            log.error("tokens file %s: %s; keeping the %d token(s) loaded before", self.path, exc,
                      len(self._entries))
            return self._entries
        with self._lock:
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._entries = load_tokens(self.path)
                    log.info("tokens file %s re-read: %d token(s)", self.path, len(self._entries))
                except AuthFileError as exc:
                    log.error("%s; keeping the %d token(s) loaded before", exc, len(self._entries))
            return self._entries


def _stamp(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns
