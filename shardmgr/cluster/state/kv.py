"""etcd access: one client, typed entries, transactions, and error translation.

Everything goes through etcd's HTTP/JSON gateway (``/v3/...``) with
etcd3gw's client as the transport: no gRPC or protobuf to pin. A :class:`Kv`
holds one HTTP session, and sessions are not shared between threads, so a
thread of its own (a lease's keepalive, a watch) makes its own ``Kv``.

Every request is bounded by ``ClusterConfig.etcd_timeout_s``. A failure
becomes a :class:`CoordinationUnavailable` (unreachable, timed out, etcd
busy: retryable), a :class:`CoordinationDenied` (etcd refused the password,
the certificate or the user's permissions: one line saying which, never the
password) or a :class:`CoordinationError` (refused otherwise), naming the
endpoint and what was asked, with the library's exception as its cause. A
write that timed out may or may not have been applied.

TLS and users (``EtcdSecurity``): etcd3gw's session carries the CA and the
client certificate; with a user, every request carries the process's
token for it (etcd_auth.py), and a request etcd answers "invalid auth
token" is repeated once with a new token, so an expired token or an etcd
restart costs one authentication, not an error.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any, Protocol

import etcd3gw
import requests
from etcd3gw import exceptions as etcd_exceptions

from shardmgr.cluster.config import EtcdSecurity
from shardmgr.cluster.errors import CoordinationDenied, CoordinationError, CoordinationUnavailable
from shardmgr.cluster.state import etcd_auth

#: etcd3gw's errors that mean "try again later" rather than "refused"
RETRYABLE = (etcd_exceptions.ConnectionFailedError, etcd_exceptions.ConnectionTimeoutError,
             etcd_exceptions.InternalServerError, requests.RequestException)
#: how a TLS port of etcd answers plain HTTP (it also means an etcd that went away mid-request: still retryable)
PLAIN_TO_TLS = "Remote end closed connection without response"
#: added to an unreachable etcd's error when plain HTTP may have met a TLS port
TLS_PORT_HINT = " (an etcd port that speaks TLS closes plain HTTP connections so: give --etcd-ca if this one does)"
#: what a request may raise: etcd3gw's errors, requests' (an OSError), an OSError loading a TLS file
FAILURES = (etcd_exceptions.Etcd3Exception, OSError)


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One key as etcd holds it. Revisions are etcd's store revisions (ints;
    the gateway sends them as strings); ``lease`` is 0 for none."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclasses.dataclass(frozen=True, slots=True)
class TxnResult:
    """A transaction's outcome: which branch ran, the entries its range
    operations read (in order, each a list), and the store revision after it."""

    succeeded: bool
    ranges: list[list[Entry]]
    revision: int


def encode(data: str | bytes) -> str:
    """Base64, as the gateway wants keys and values."""
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def prefix_end(prefix: str) -> str:
    """The range end that covers every key starting with ``prefix`` (its last byte + 1)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1  # prefixes here end in '/' (0x2f), never 0xff
    return encode(bytes(raw))


def entry(kv: dict[str, Any]) -> Entry:
    """An Entry from the gateway's JSON KeyValue (absent fields are zero: proto3 defaults)."""
    return Entry(key=base64.b64decode(kv["key"]).decode(), value=base64.b64decode(kv.get("value", "")),
                 create_revision=int(kv.get("create_revision", 0)), mod_revision=int(kv.get("mod_revision", 0)),
                 version=int(kv.get("version", 0)), lease=int(kv.get("lease", 0)))


# Transaction parts, as the gateway's JSON wants them (etcd's rpc.proto: Compare, RequestOp).
def same_create(key: str, revision: int) -> dict[str, Any]:
    """Compare: the key's create_revision is ``revision`` (0: the key does not exist)."""
    return {"key": encode(key), "result": "EQUAL", "target": "CREATE", "create_revision": revision}


def same_mod(key: str, revision: int) -> dict[str, Any]:
    """Compare: the key's mod_revision is ``revision`` (it was not changed since read at that revision)."""
    return {"key": encode(key), "result": "EQUAL", "target": "MOD", "mod_revision": revision}


def same_value(key: str, value: bytes) -> dict[str, Any]:
    """Compare: the key's value is ``value``."""
    return {"key": encode(key), "result": "EQUAL", "target": "VALUE", "value": encode(value)}


def present(key: str) -> dict[str, Any]:
    """Compare: the key exists (its create_revision is above 0)."""
    return {"key": encode(key), "result": "GREATER", "target": "CREATE", "create_revision": 0}


def same_lease(key: str, lease: int) -> dict[str, Any]:
    """Compare: the key is attached to lease ``lease``."""
    return {"key": encode(key), "result": "EQUAL", "target": "LEASE", "lease": lease}


def put_op(key: str, value: bytes, lease: int = 0) -> dict[str, Any]:
    op: dict[str, Any] = {"key": encode(key), "value": encode(value)}
    if lease:
        op["lease"] = lease
    return {"request_put": op}


def range_op(key: str) -> dict[str, Any]:
    return {"request_range": {"key": encode(key)}}


def range_prefix_op(prefix: str) -> dict[str, Any]:
    """Read every key under ``prefix`` (several of these in one transaction: one revision)."""
    return {"request_range": {"key": encode(prefix), "range_end": prefix_end(prefix)}}


def delete_op(key: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": encode(key)}}


class EtcdEndpoint(Protocol):
    """What a Kv needs of its config: a ClusterConfig, or the endpoint of a client (cluster_client.py)."""

    @property
    def etcd_host(self) -> str: ...

    @property
    def etcd_port(self) -> int: ...

    @property
    def etcd_timeout_s(self) -> float: ...

    @property
    def etcd_security(self) -> EtcdSecurity: ...


class Kv:
    """A client of the cluster's etcd (one HTTP session; use from one thread at a time)."""

    def __init__(self, config: EtcdEndpoint) -> None:
        self.config = config
        self.endpoint = f"{config.etcd_host}:{config.etcd_port}"
        security = self.security = config.etcd_security
        # api_path given: no discovery round-trip; /v3/ is etcd >= 3.4's gateway
        self._client = etcd3gw.client(host=config.etcd_host, port=config.etcd_port,
                                      timeout=config.etcd_timeout_s, api_path="/v3/", protocol=security.scheme,
                                      ca_cert=None if security.ca is None else str(security.ca),
                                      cert_cert=None if security.cert is None else str(security.cert),
                                      cert_key=None if security.key is None else str(security.key))
        # Per request too: requests lets $REQUESTS_CA_BUNDLE override a session's CA file, not a request's
        self._tls: dict[str, Any] = {} if not security.uses_tls else {
            "verify": True if security.ca is None else str(security.ca),
            "cert": None if security.cert is None else (str(security.cert), str(security.key))}
        #: this process's tokens for the user (None: no user, no token sent)
        self.tokens = (etcd_auth.tokens_for(config.etcd_host, config.etcd_port, security)
                       if security.user is not None else None)

    def close(self) -> None:
        self._client.session.close()

    def token(self) -> str | None:
        """The user's current token (authenticating first if there is none); None without a user."""
        return None if self.tokens is None else self.tokens.current(self._login)

    def renew_token(self, stale: str) -> str:
        """A token other than ``stale`` (etcd refused it); see etcd_auth.py."""
        assert self.tokens is not None
        return self.tokens.renew(stale, self._login)

    def post(self, path: str, body: dict[str, Any], what: str) -> dict[str, Any]:
        """One gateway request; errors translated, a stale token renewed once (module docstring)."""
        token = self.token()
        try:
            return self._post(path, body, token)
        except FAILURES as e:
            if token is None or not etcd_auth.is_stale_token(etcd_auth.etcd_message(getattr(e, "detail_text", None))):
                raise self._translate(e, what) from e
        try:
            return self._post(path, body, self.renew_token(token))
        except FAILURES as e:
            raise self._translate(e, what) from e

    def _post(self, path: str, body: dict[str, Any], token: str | None) -> dict[str, Any]:
        headers = {} if token is None else {"Authorization": token}
        answer: dict[str, Any] = self._client.post(self._client.get_url(path), json=body, headers=headers,
                                                   **self._tls)
        return answer

    def _login(self) -> str:
        """A new token for the user (the password read now; never in an error)."""
        assert self.security.user is not None
        credentials = {"name": self.security.user, "password": self.security.read_password()}
        what = f"authenticate as user {self.security.user!r}"
        try:
            return str(self._post("/auth/authenticate", credentials, None)["token"])
        except FAILURES as e:
            raise self._translate(e, what) from e
        except (KeyError, TypeError) as e:
            raise CoordinationError(f"etcd {self.endpoint}: {what}: the answer holds no token") from e

    def _translate(self, e: BaseException, what: str) -> CoordinationError:
        """The error to raise for a failed request (module docstring)."""
        message = etcd_auth.etcd_message(getattr(e, "detail_text", None))
        refused = etcd_auth.tls_refusal(e, self.security) or etcd_auth.refusal(message, self.security.user)
        if refused is not None:
            return CoordinationDenied(f"etcd {self.endpoint}: {what}: {refused}")
        if isinstance(e, RETRYABLE):
            hint = "" if self.security.uses_tls or PLAIN_TO_TLS not in describe(e) else TLS_PORT_HINT
            return CoordinationUnavailable(f"etcd {self.endpoint}: {what}: {describe(e)}{hint}")
        return CoordinationError(f"etcd {self.endpoint}: {what}: {describe(e)}")

    def get(self, key: str) -> Entry | None:
        """The key's entry, or None if absent."""
        answer = self.post("/kv/range", {"key": encode(key)}, f"get {key}")
        kvs = answer.get("kvs", [])
        return entry(kvs[0]) if kvs else None

    def get_prefix(self, prefix: str) -> tuple[list[Entry], int]:
        """Every key under ``prefix`` (sorted by key) and the store revision
        they were read at: a watch from revision + 1 misses nothing after them."""
        answer = self.post("/kv/range", {"key": encode(prefix), "range_end": prefix_end(prefix)},
                           f"get prefix {prefix}")
        return [entry(kv) for kv in answer.get("kvs", [])], int(answer["header"]["revision"])

    def put(self, key: str, value: bytes, lease: int = 0) -> int:
        """Set the key; returns the store revision of the write."""
        body: dict[str, Any] = {"key": encode(key), "value": encode(value)}
        if lease:
            body["lease"] = lease
        return int(self.post("/kv/put", body, f"put {key}")["header"]["revision"])

    def delete(self, key: str) -> bool:
        """Delete the key; True if it existed."""
        return int(self.post("/kv/deleterange", {"key": encode(key)}, f"delete {key}").get("deleted", 0)) > 0

    def txn(self, compare: list[dict[str, Any]], success: list[dict[str, Any]], failure: list[dict[str, Any]],
            what: str) -> TxnResult:
        """One transaction: atomically, if every compare holds run ``success``, else ``failure``."""
        answer = self.post("/kv/txn", {"compare": compare, "success": success, "failure": failure}, what)
        ranges = [[entry(kv) for kv in r["response_range"].get("kvs", [])]
                  for r in answer.get("responses", []) if "response_range" in r]
        return TxnResult(succeeded=bool(answer.get("succeeded", False)), ranges=ranges,
                         revision=int(answer["header"]["revision"]))

    def grant(self, ttl_s: int) -> tuple[int, int]:
        """A new lease: (id, granted TTL in seconds)."""
        answer = self.post("/lease/grant", {"TTL": ttl_s, "ID": 0}, f"grant a {ttl_s} s lease")
        return int(answer["ID"]), int(answer["TTL"])

    def keepalive(self, lease: int) -> int:
        """Renew the lease once: its TTL again, or <= 0 if it has already expired."""
        answer = self.post("/lease/keepalive", {"ID": lease}, f"keep lease {lease:x} alive")
        return int(answer.get("result", {}).get("TTL", -1))

    def revoke(self, lease: int) -> None:
        """End the lease now: every key attached to it is deleted."""
        self.post("/kv/lease/revoke", {"ID": lease}, f"revoke lease {lease:x}")


def describe(e: BaseException) -> str:
    """An etcd3gw error's useful text: its HTTP body when it has one."""
    detail = getattr(e, "detail_text", None)
    return f"{type(e).__name__}: {detail or e}"
