"""The ``shardmgr`` command line (click). Each command is a thin layer over the library.

Two groups of commands live with their packages and are registered here:
``shardmgr cluster ...`` (shardmgr/cli/cluster.py) and ``shardmgr
verify`` (shardmgr/cli/verify.py)."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from common.errors import CommonError
from common.journal import CorruptJournal, FormatError, Journal
from common.wire.client import MAX_CLIENT_SECONDS, TOKEN_ENV, ConnectionLost, RpcClient
from shardmgr import __version__
from shardmgr.server.config import DEFAULT_PORT, ServerConfig

from . import tables
from .cluster import cluster, etcd_options
from .verify import verify

EXIT_OK = 0
EXIT_FAILED = 1  # the command could not do its job (unreachable server, locked directory, ...)
EXIT_DAMAGED = 2  # the file is not a journal, or its durable data is damaged

_DEFAULTS = ServerConfig()
DEFAULT_AUTH_FILE = "shardmgr.tokens"


@click.group()
@click.version_option(__version__, prog_name="shardmgr")
def main() -> None:
    """Vector shards and a durable work queue on one append-only journal layer."""


main.add_command(cluster)  # shardmgr/cli/cluster.py: 'shardmgr cluster status'
main.add_command(verify)  # shardmgr/cli/verify.py: 'shardmgr verify'


@main.command()
@click.option("--data", "data_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Data directory, created if missing.", show_default=str(_DEFAULTS.data_dir))
@click.option("--host", default=None, help="Address to listen on.", show_default=_DEFAULTS.host)
@click.option("--port", type=click.IntRange(0, 65535), default=None, help="TCP port (0: any free one).",
              show_default=str(_DEFAULTS.port))
@click.option("--flush-interval-ms", type=float, default=None, help="Group-commit interval.",
              show_default=str(_DEFAULTS.flush_interval_ms))
@click.option("--ready-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write JSON {host, port, pid} here once the port is open; removed on a clean stop.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics on this port (documented choice: 7301).", show_default="off")
@click.option("--max-frame-bytes", type=int, default=None, help="Largest frame accepted.",
              show_default=str(_DEFAULTS.max_frame_bytes))
@click.option("--shutdown-timeout", "shutdown_timeout_s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds a clean stop may take before what is left is cut off.",
              show_default=str(_DEFAULTS.shutdown_timeout_s))
@click.option("--log-level", default=None, show_default=_DEFAULTS.log_level)
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="TOML file of ServerConfig fields; options given here override it.")
@click.option("--auth-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Tokens file ('shardmgr token create'): every connection must present a token.")
@click.option("--insecure", is_flag=True, default=None,
              help="Allow a non-loopback --host/--metrics-host without --auth-file, and a non-loopback etcd "
                   "without TLS (logs a warning).")
@click.option("--metrics-host", default=None, help="Address of the metrics endpoint.",
              show_default=_DEFAULTS.metrics_host)
@click.option("--metrics-open", is_flag=True, default=None,
              help="With --auth-file: serve /metrics without a token (the cluster pages still need one).")
@click.option("--tls-cert", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="PEM certificate chain: serve TLS (with --tls-key).")
@click.option("--tls-key", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="PEM private key of --tls-cert.")
@click.option("--tls-client-ca", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="PEM CA file: require client certificates it signed.")
@click.option("--cluster", default=None, metavar="etcd://HOST:PORT/PREFIX",
              help="Join this cluster (docs/cluster.md); needs --object-store.", show_default="single node")
@click.option("--object-store", default=None, metavar="s3://BUCKET/PREFIX", help="Where sealed shards go (cluster).")
@click.option("--s3-endpoint", default=None, metavar="URL", show_default="AWS",
              help="S3 endpoint (SeaweedFS, MinIO); credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY.")
@click.option("--node-id", default=None, help="This node's id in the cluster.",
              show_default="<host name>-<hash of the data directory>")
@click.option("--advertise", default=None, metavar="HOST:PORT", help="Where other nodes and clients reach this node.",
              show_default="the listening address")
@etcd_options
def serve(config_file: Path | None, **options: object) -> None:
    """Run the service on one port until SIGTERM or SIGINT.

    The port opens only after every component has recovered its data; the
    log (and --ready-file) says when it is ready. A second server on the
    same data directory is refused.
    """
    import logging

    from shardmgr.server.server import Server

    try:
        config = ServerConfig.load(config_file, **options)
    except (ValueError, OSError) as exc:
        raise click.UsageError(str(exc)) from None
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        code = Server(config).run()
    except (CommonError, OSError, ValueError) as exc:  # ValueError: a bad tokens file or TLS file
        click.echo(f"shardmgr serve: {exc}", err=True)
        raise SystemExit(EXIT_FAILED) from None
    raise SystemExit(code)


def _seconds(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """A finite number of seconds (click's FloatRange lets NaN through; a NaN retried forever)."""
    if not 0 <= value <= MAX_CLIENT_SECONDS:
        raise click.BadParameter(f"must be a number of seconds in 0..{MAX_CLIENT_SECONDS:g}, got {value}")
    return value


_CLIENT_SECURITY = ("token", "tls", "ca", "client_cert", "client_key")


def server_options(command: Callable[..., None]) -> Callable[..., None]:
    """--host, --port, --timeout and the token and TLS options, for commands
    that talk to a running server (remote_call uses the last ones)."""

    inner = command

    @functools.wraps(inner)
    def with_security(**kwargs: Any) -> None:
        click.get_current_context().meta["rpc_options"] = {k: kwargs.pop(k) for k in _CLIENT_SECURITY}
        inner(**kwargs)

    command = with_security
    command = click.option("--client-key", type=click.Path(dir_okay=False), default=None,
                           help="PEM key of --client-cert.")(command)
    command = click.option("--client-cert", type=click.Path(dir_okay=False), default=None,
                           help="PEM client certificate, for servers that require one (implies --tls).")(command)
    command = click.option("--ca", type=click.Path(dir_okay=False), default=None,
                           help="PEM CA file to check the server's certificate (implies --tls).")(command)
    command = click.option("--tls", is_flag=True, help="Connect with TLS.")(command)
    command = click.option("--token", envvar=TOKEN_ENV, default=None, show_envvar=True,
                           help="Token for a server with --auth-file.")(command)
    command = click.option("--timeout", type=float, default=5.0, show_default=True, callback=_seconds,
                           help="Seconds to keep trying to connect.")(command)
    command = click.option("--port", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True)(command)
    return click.option("--host", default="127.0.0.1", show_default=True)(command)


def remote_call(what: str, host: str, port: int, timeout: float, cmd: str,
                args: dict[str, object] | None = None, wait: float | None = 30.0,
                lost: Callable[[ConnectionLost], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Call ``cmd`` on the server, waiting up to ``wait`` seconds for the
    answer (None: as long as it takes); ``lost`` answers in its place if the
    connection broke with the call in flight; on failure print why and exit EXIT_FAILED."""
    try:
        options = click.get_current_context().meta.get("rpc_options", {})
        with RpcClient((host, port), retry_for=timeout, timeout=max(timeout, 30.0), **options) as client:
            try:
                return client.call(cmd, args, timeout=None if wait is None else max(timeout, wait)).result
            except ConnectionLost as exc:
                if lost is None:
                    raise
                return lost(exc)
    except (CommonError, ValueError) as exc:  # ValueError: a TLS file that cannot be loaded
        click.echo(f"shardmgr {what}: {exc}", err=True)
        raise SystemExit(EXIT_FAILED) from None


@main.command()
@server_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def stats(host: str, port: int, timeout: float, as_json: bool) -> None:
    """Print a running server's counters, per component.

    On a terminal, a table per component. Piped or redirected, one line per
    counter, never wrapped or cut: COMPONENT, COUNTER, VALUE, tab-separated.
    """
    result = remote_call("stats", host, port, timeout, "stats")
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    console = Console()
    for component, values in result.items():
        table = Table(title=component)
        table.add_column("counter")
        table.add_column("value", justify="right")
        tables.show(console, table, sorted(values.items()), component)


@main.group()
def queue() -> None:
    """Operate the work queue of a running server."""


@queue.command("stats")
@server_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def queue_stats(host: str, port: int, timeout: float, as_json: bool) -> None:
    """Per key: pending, in flight, buried, oldest pending age, segments,
    live/dead bytes, and the oldest item pinning the oldest segment.

    On a terminal, two tables. Piped or redirected, one line per total and
    per key, never wrapped or cut, tab-separated: "totals", NAME, VALUE; and
    "key", MODEL, SHAPE, LANE, PENDING, IN_FLIGHT, BURIED, OLDEST_PENDING,
    SEGMENTS, LIVE_BYTES, DEAD_BYTES, PINNED_BY.
    """
    result = remote_call("queue stats", host, port, timeout, "workq.stats")
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    console = Console()
    tables.show(console, Table("name", "value", title="work queue", show_header=False),
                result["totals"].items(), "totals")
    table = Table(title="keys")
    for col in ("model", "shape", "lane", "pending", "in flight", "buried", "oldest pending", "segments",
                "live bytes", "dead bytes", "pinned by"):
        table.add_column(col, justify="left" if col in ("model", "shape", "lane", "pinned by") else "right")
    rows = []
    for row in result["keys"]:
        age = row["oldest_pending_age_s"]
        pin = row["pinned_by"]
        rows.append((row["model"], row["shape"], row["lane"], row["pending"], row["in_flight"], row["buried"],
                     "-" if age is None else f"{age:,.1f} s", row["segments"], row["live_bytes"], row["dead_bytes"],
                     "-" if pin is None else f"{pin['handle']} ({pin['job']}, {pin['state']}, {pin['age_s']:.0f} s)"))
    tables.show(console, table, rows, "key")


@queue.command("kick")
@click.argument("job")
@server_options
def queue_kick(job: str, host: str, port: int, timeout: float) -> None:
    """Make JOB's buried items pending again (their delivery counts restart)."""
    kicked = remote_call("queue kick", host, port, timeout, "workq.kick", {"job": job})["kicked"]
    click.echo(f"kicked {kicked} buried item(s) of job {job!r}")


@main.group()
def token() -> None:
    """Manage the tokens file of 'shardmgr serve --auth-file'."""


@token.command("create")
@click.argument("name")
@click.option("--roles", required=True, help="Comma-separated: read, write, worker, admin (admin implies all).")
@click.option("--auth-file", type=click.Path(dir_okay=False, path_type=Path), default=Path(DEFAULT_AUTH_FILE),
              show_default=True, help="Tokens file to append to (created with mode 0600).")
def token_create(name: str, roles: str, auth_file: Path) -> None:
    """Create a token NAME with ROLES: print it once, store only its hash.

    A running server picks the new line up at its next authentication.
    """
    from shardmgr.server.auth import AuthFileError, add_token

    try:
        secret = add_token(auth_file, name, roles.split(","))
    except (AuthFileError, OSError) as exc:
        click.echo(f"shardmgr token create: {exc}", err=True)
        raise SystemExit(EXIT_FAILED) from None
    click.echo(secret)
    click.echo(f"token {name!r} added to {auth_file}; it is shown only this once "
               f"(clients: token= or {TOKEN_ENV})", err=True)


@main.group()
def journal() -> None:
    """Inspect journal files."""


@journal.command("inspect")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def inspect(path: Path, as_json: bool) -> None:
    """Show a journal's header, newest checkpoint and what recovery would do.

    Opens the file read-only and changes nothing. Exit status 0 if the
    journal is readable (a torn tail is reported, not an error), 2 if it is
    not a journal or its durable data is damaged. Piped or redirected, one
    line per field instead of a table: NAME, VALUE, tab-separated.
    """
    try:
        j = Journal.open(path, writable=False)
    except (FormatError, CorruptJournal) as exc:
        if as_json:
            click.echo(json.dumps({"path": str(path), "error": str(exc), "offset": exc.offset}))
        else:
            click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_DAMAGED) from None
    with j:
        info = {
            "path": str(path), "kind": j.kind.decode(), "uuid": j.identity.uuid_str,
            "format_version": j.identity.format_version, "alignment": j.alignment,
            "max_record_bytes": j.identity.max_record_bytes, "metadata_bytes": len(j.metadata),
            "records": j.count, "end": j.end, "sealed": j.sealed,
            "counters": {m.name.lower(): n for m, n in j.counters.items()},
            "recovery": _recovery_dict(j),
        }
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    rows = [(key, ", ".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else str(value))
            for key, value in info.items()]
    tables.show(Console(), Table(title=str(path), show_header=False), rows)


def _recovery_dict(j: Journal) -> dict[str, object]:
    if j.recovery is None:
        return {"scanned": False}
    report = dataclasses.asdict(j.recovery)
    report["checkpoint"] = {"generation": j.recovery.checkpoint.generation, "end": j.recovery.checkpoint.end}
    report["seconds"] = round(report["seconds"], 6)
    report["clean"] = j.recovery.clean
    return report


@main.command()
@server_options
@click.argument("dest", type=click.Path(path_type=Path))
@click.option("--data", "data_dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Copy this data directory itself (no server may have it open) instead of asking a server.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def snapshot(host: str, port: int, timeout: float, dest: Path, data_dir: Path | None, as_json: bool) -> None:
    """Copy the data at one durable point to the new directory DEST.

    Asks the running server (the admin role), which writes DEST on its own
    machine: a relative DEST is made absolute here first. Sealed shard files
    are hard-linked when DEST is on the same file system; writes wait while
    the rest is copied. DEST is a data directory: `shardmgr verify DEST`,
    `shardmgr serve --data DEST`.
    """
    if data_dir is not None:
        from shardmgr.snapshots import snapshot as offline

        try:
            result = offline(data_dir, dest)
        except CommonError as exc:
            click.echo(f"shardmgr snapshot: {exc}", err=True)
            raise SystemExit(EXIT_FAILED) from None
    else:
        from shardmgr.server.exposure import is_loopback
        from shardmgr.snapshots import after_lost_answer, identity

        target = dest.absolute()
        before = identity(target)  # if the answer is lost, only a DEST that appears meanwhile can be this one
        result = remote_call("snapshot", host, port, timeout, "snapshot", {"dest": str(target)}, wait=None,
                             lost=lambda exc: after_lost_answer(target, exc, local=is_loopback(host), before=before))
    if as_json:
        click.echo(json.dumps(result, sort_keys=True))
    elif "answer_lost" in result:
        click.echo(f"snapshot {result['dest']}: complete and verified (the server's answer was lost: "
                   f"{result['answer_lost']}; its rename was made durable here)")
    else:
        click.echo(f"snapshot {result['dest']}: {result['bytes_copied']:,} bytes copied (the rest linked) in "
                   f"{result['seconds']} s; writes paused {result['paused_s']} s")
