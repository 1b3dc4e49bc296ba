"""``shardmgr cluster ...``: the cluster's commands (click), registered by
shardmgr/cli/main.py. Importing this module imports no cluster extra (boto3,
etcd3gw): each command imports what it needs when it runs, so the command
line works without the extra and says what is missing when asked for it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from shardmgr.cluster.config import ETCD_PASSWORD_ENV, EtcdSecurity

from . import tables

if TYPE_CHECKING:
    from shardmgr.cluster.config import ClusterConfig
    from shardmgr.cluster.operations.status import ClusterStatus, CollectionStatus, HolderStatus, NodeStatus

EXIT_FAILED = 1  # as shardmgr/cli/main.py: the command could not do its job
#: the bucket of a status read given no --object-store: a placeholder the status never asks for
NO_OBJECT_STORE = "s3://no-object-store"
NOT_REPORTED = "not reported"
#: the columns of each table (on a terminal, its header; piped, the line before its rows)
NODE_COLUMNS = ("node", "address", "lease", "ttl", "state", "report", "writes", "serving", "unpublished rows",
                "failing uploads")
COLLECTION_COLUMNS = ("collection", "dim", "metric", "writer", "shards", "rows", "deleted", "published rows",
                      "unpublished rows", "deletes unpublished", "failing uploads", "bytes", "owners", "served")
FAILING_COLUMNS = ("node", "collection", "shard", "what", "tries", "since", "last error")
GONE_COLUMNS = ("node", "address", "last report", "unpublished rows", "holds unpublished")


#: the etcd options' parameter names: ServerConfig's fields of the same names (``serve``)
ETCD_OPTIONS = ("etcd_tls", "etcd_ca", "etcd_cert", "etcd_key", "etcd_user", "etcd_password_file")


def etcd_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options of how etcd is reached (TLS, client certificate, user), as
    keyword arguments named ETCD_OPTIONS. There is no password option: a
    command line is visible to every user (``ps``)."""
    file = click.Path(dir_okay=False, path_type=Path)
    for name, help_text in reversed((
            ("--etcd-tls", "Speak TLS to etcd, checking it against the system's CAs (--etcd-ca implies it)."),
            ("--etcd-ca", "PEM CA file etcd's certificate is checked against (implies --etcd-tls)."),
            ("--etcd-cert", "PEM client certificate, for an etcd started with --client-cert-auth."),
            ("--etcd-key", "PEM key of --etcd-cert."),
            ("--etcd-user", "etcd user to authenticate as (etcd with auth enabled)."),
            ("--etcd-password-file", f"File whose first line is --etcd-user's password (else ${ETCD_PASSWORD_ENV})."))):
        if name == "--etcd-tls":
            command = click.option(name, is_flag=True, default=None, help=help_text)(command)
        elif name == "--etcd-user":
            command = click.option(name, default=None, metavar="NAME", help=help_text)(command)
        else:
            command = click.option(name, type=file, default=None, help=help_text)(command)
    return command


def etcd_security(options: dict[str, Any], insecure: bool) -> EtcdSecurity:
    """The EtcdSecurity of the etcd options' values (not validated: ClusterConfig and EtcdAddress do that)."""
    return EtcdSecurity(tls=bool(options.get("etcd_tls")), ca=options.get("etcd_ca"), cert=options.get("etcd_cert"),
                        key=options.get("etcd_key"), user=options.get("etcd_user"),
                        password_file=options.get("etcd_password_file"), insecure=insecure)


def etcd_client_options(command: Callable[..., None]) -> Callable[..., None]:
    """etcd_options and ``--insecure``, given to the command as one ``etcd_security`` (an EtcdSecurity)."""
    inner = command

    @functools.wraps(inner)
    def with_etcd(**kwargs: Any) -> None:
        given = {name: kwargs.pop(name) for name in ETCD_OPTIONS}
        inner(etcd_security=etcd_security(given, bool(kwargs.pop("insecure"))), **kwargs)

    command = click.option("--insecure", is_flag=True,
                           help="Allow a non-loopback etcd without TLS (protected mode, docs/security.md).")(with_etcd)
    return etcd_options(command)


@click.group()
def cluster() -> None:
    """Look at a cluster of 'shardmgr serve --cluster' nodes (docs/cluster.md)."""


@cluster.command("status")
@click.option("--cluster", "cluster_url", required=True, metavar="etcd://HOST:PORT/PREFIX",
              help="The cluster's etcd and key prefix.")
@click.option("--object-store", default=None, metavar="s3://BUCKET/PREFIX",
              help="Also list the bucket's objects: bytes stored, and orphans (objects no shard entry names).")
@click.option("--s3-endpoint", default=None, metavar="URL", show_default="AWS",
              help="S3 endpoint; credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY.")
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True,
              help="Owners per shard in the rendezvous placement shown.")
@click.option("--timeout", type=click.FloatRange(min=0.1, max=60), default=2.0, show_default=True,
              help="Seconds per etcd request.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@etcd_client_options
def status(cluster_url: str, object_store: str | None, s3_endpoint: str | None, replicas: int, timeout: float,
           as_json: bool, etcd_security: EtcdSecurity) -> None:
    """Nodes (their leases, health, reports, rows not yet published and
    failing uploads), collections (writers, live, deleted, published and
    unpublished rows, where shards are served), failing uploads, nodes gone
    without a clean stop, holders of unpublished rows, and bytes in object
    storage: one read of etcd, at one revision.

    Exit status 0 once read (problems found in keys are shown, not fatal),
    1 if etcd or the object store cannot be read. On a terminal, tables.
    Piped or redirected, one tab-separated line per row, led by its table's
    name: node, collection, partial, failing, gone, holder, orphan,
    problem; before each table's rows, a line naming its columns, led by
    "#" and the table's name ("#node", "node", "address", ...).

    
    node: NODE ADDRESS LEASE TTL STATE REPORT WRITES SERVING UNPUBLISHED_ROWS FAILING_UPLOADS
    collection: COLLECTION DIM METRIC WRITER SHARDS ROWS DELETED PUBLISHED_ROWS UNPUBLISHED_ROWS
      DELETES_UNPUBLISHED FAILING_UPLOADS BYTES OWNERS SERVED
    partial: COLLECTION NOT_COUNTED
    failing: NODE COLLECTION SHARD WHAT TRIES SINCE LAST_ERROR
    gone: NODE ADDRESS LAST_REPORT UNPUBLISHED_ROWS HOLDS_UNPUBLISHED
    holder: COLLECTION NODE STATE
    """
    try:
        from shardmgr.cluster.errors import ClusterError
        from shardmgr.cluster.operations.status import read_status
    except ImportError as exc:
        raise click.UsageError(f"needs the cluster extra (pip install 'shardmgr[cluster]'): {exc}") from None
    try:
        config = _config(cluster_url, object_store, s3_endpoint, timeout, etcd_security)
        objects = None
        if object_store is not None:
            from shardmgr.cluster.state.objects import ObjectStore

            objects = ObjectStore(config)
        try:
            found = read_status(config, objects=objects, replicas=replicas)
        finally:
            if objects is not None:
                objects.close()
    except ClusterError as exc:
        click.echo(f"shardmgr cluster status: {exc}", err=True)
        raise SystemExit(EXIT_FAILED) from None
    if as_json:
        click.echo(json.dumps(found.as_dict(), indent=2))
    else:
        show(Console(), found)


def _config(cluster_url: str, object_store: str | None, s3_endpoint: str | None, timeout: float,
            security: EtcdSecurity) -> ClusterConfig:
    from shardmgr.cluster.config import ClusterConfig

    ttl = max(2, int(timeout) + 1)  # the config wants etcd_timeout_s below a lease TTL; no lease is taken here
    return ClusterConfig.from_urls(cluster_url, object_store or NO_OBJECT_STORE, s3_endpoint=s3_endpoint,
                                   etcd_timeout_s=timeout, lease_ttl_s=ttl, etcd_security=security)


def show(console: Console, found: ClusterStatus) -> None:
    """``found`` as a summary line and tables (tables.py: plain lines off a
    terminal, each table's led by a line naming its columns)."""
    tables.say(console, f"cluster {found.etcd} at revision {found.revision}: {len(found.nodes)} nodes, "
                        f"{len(found.collections)} collections, {found.shards} shards published, {found.rows:,} "
                        f"live rows, {found.bytes:,} bytes in object storage")
    nodes = Table(*NODE_COLUMNS, title="nodes")
    tables.show(console, nodes, [_node_row(n) for n in found.nodes], "node", header=True)
    collections = Table(title=f"collections (owners: rendezvous, {found.replicas} per shard)")
    for column in COLLECTION_COLUMNS:
        collections.add_column(column, justify="left" if column in ("collection", "metric", "writer", "owners",
                                                                     "served") else "right")
    tables.show(console, collections, [_collection_row(c) for c in found.collections], "collection", header=True)
    partial = [(c.name, why) for c in found.collections for why in c.missing]
    if partial:
        tables.show(console, Table("collection", "not counted", title="counts that are not whole"), partial,
                    "partial", header=True)
    failing = [(n.node_id, f) for n in found.nodes for f in n.failing] + \
        [(g.node_id, f) for g in found.gone for f in g.failing]
    if failing:
        tables.show(console, Table(*FAILING_COLUMNS, title="uploads failing (retried)"),
                    [(node, f.collection, f.shard_id, f.what, f.tries, _ago(found.read_at - f.since), f.error)
                     for node, f in failing], "failing", header=True)
    if found.gone:
        tables.show(console, Table(*GONE_COLUMNS, title="gone: not members, did not stop cleanly"),
                    [(g.node_id, g.address, _ago(g.report_age_s), _rows(g.unpublished_rows), ", ".join(g.holds))
                     for g in found.gone], "gone", header=True)
    if found.holders:
        holders = Table("collection", "node", "state", title="holders of unpublished rows")
        tables.show(console, holders, [(h.collection, h.node_id, _holder_state(h)) for h in found.holders],
                    "holder", header=True)
    if found.objects is not None:
        o = found.objects
        tables.say(console, f"objects under {o.url}: {o.objects} ({o.bytes:,} bytes); {len(o.orphans)} orphans "
                            f"({o.orphan_bytes:,} bytes) no published entry names")
        tables.show(console, Table("orphan", title="orphans"), [(key,) for key in o.orphans], "orphan", header=True)
    if found.problems:
        tables.show(console, Table("key", "problem", title="keys that did not decode"),
                    [(p.key, p.error) for p in found.problems], "problem", header=True)


def _node_row(n: NodeStatus) -> tuple[str | Text, ...]:
    ttl = "-" if n.ttl_s is None else ("expired" if n.ttl_s < 0 else f"{n.ttl_s}/{n.granted_ttl_s} s")
    serving = NOT_REPORTED if n.serving is None else (
        ", ".join(f"{name} {len(ids)}" for name, ids in sorted(n.serving.items())) or "nothing")
    state: str | Text = Text(f"suspect: {n.suspect}", style="red") if n.suspect else "ok"
    return (n.node_id, n.address, n.lease, ttl, state, NOT_REPORTED if n.report_age_s is None else
            _ago(n.report_age_s), ", ".join(n.writes), serving,
            NOT_REPORTED if n.unpublished_rows is None else _rows(n.unpublished_rows),
            Text(str(len(n.failing)), style="red") if n.failing else "0")


def _collection_row(c: CollectionStatus) -> tuple[str | int | Text | None, ...]:
    writer: str | Text = "-"
    if c.writer is not None:
        writer = f"{c.writer.node_id} (token {c.writer.revision})"
        if not c.writer.live:
            writer = Text(f"{writer}, not a member", style="red")
    placed: dict[str, int] = {}
    served: dict[str, int] = {}
    for shard in c.shards:
        for node in shard.owners:
            placed[node] = placed.get(node, 0) + 1
        for node in shard.served_by or ():
            served[node] = served.get(node, 0) + 1
    rows: int | Text = Text(f"{c.rows:,} (partial)", style="red") if c.missing else c.rows
    return (c.name, c.dim, c.metric, writer, len(c.shards), rows, c.deleted, c.published_rows, c.unpublished_rows,
            c.deletes_unpublished, Text(str(c.failing), style="red") if c.failing else 0, c.bytes, _counts(placed),
            NOT_REPORTED if c.served is None else f"{c.served}/{len(c.shards)}" + (
                f" ({_counts(served)})" if served else ""))


def _rows(by_collection: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {rows}" for name, rows in sorted(by_collection.items())) or "0"


def _ago(seconds: float) -> str:
    return f"{seconds:.1f} s ago"


def _counts(by_node: dict[str, int]) -> str:
    return ", ".join(f"{node} {count}" for node, count in sorted(by_node.items()))


def _holder_state(holder: HolderStatus) -> str | Text:
    from shardmgr.cluster.operations.status import HOLDER_GONE

    state = ("live" if holder.live else "not a member") + (", clean" if holder.clean else "")
    return Text(f"{state}: {HOLDER_GONE}", style="red") if holder.unavailable else state

