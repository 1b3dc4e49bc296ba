"""``shardmgr verify``: the command (click), registered by shardmgr/cli/main.py.

A thin layer over the run (shardmgr/verification/runner.py) and what it
prints (findings.py), which it imports when it runs. Importing this module imports no cluster
extra: the etcd options come from shardmgr/cli/cluster.py, which
needs none.
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

import click

from shardmgr.cluster.config import EtcdSecurity

from .cluster import etcd_client_options

if TYPE_CHECKING:
    from shardmgr.verification.report import Report

    from .findings import LateProgress


@click.command()
@click.argument("data_dir", type=click.Path(path_type=Path), required=False)
@click.option("--cluster", default=None, metavar="etcd://HOST:PORT/PREFIX",
              help="Also (or only) check this cluster's shard map and objects; needs --object-store.")
@click.option("--object-store", default=None, metavar="s3://BUCKET/PREFIX", help="The cluster's bucket.")
@click.option("--s3-endpoint", default=None, metavar="URL", show_default="AWS",
              help="S3 endpoint; credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY.")
@click.option("--orphan-grace", "orphan_grace_s", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              show_default="4200: the sweep's default grace plus one period",
              help="--cluster: an orphan object older than this is repairable (the sweep should have removed it).")
@click.option("--deep", is_flag=True, help="Also read everything and verify every checksum.")
@click.option("--repair", is_flag=True, help="Offline: quarantine corrupt units, run recovery, then check again.")
@click.option("--json", "as_json", is_flag=True, help="Print one machine-readable report.")
@etcd_client_options
def verify(data_dir: Path | None, cluster: str | None, object_store: str | None, s3_endpoint: str | None,
           orphan_grace_s: float | None, deep: bool, repair: bool, as_json: bool, etcd_security: EtcdSecurity) -> None:
    """Check every file of a data directory, or a cluster, for damage.

    Read-only and safe beside a running server, unless --repair, which
    needs the directory to itself. Exit status: 0 clean, 1 only problems
    that recovery repairs by itself, 2 data corruption, 3 could not run.

    --cluster checks every published shard's objects in the bucket (size and
    crc32c; --deep downloads them) and reports orphan objects; with DATA_DIR
    too, both are checked and the verdict is the worse. --repair is for a
    data directory only.

    On a terminal, a table of the findings, worst first. Piped or
    redirected, one line per finding, never wrapped or cut: SEVERITY, PATH
    (whole, as --json gives it; a cluster's findings name an etcd:// key or
    an s3:// object), OFFSET, PROBLEM, EXPECTED, FOUND, tab-separated, "-"
    for none. Then a "repaired: ..." line per --repair action and the
    verdict line. See docs/verify.md.
    """
    from shardmgr.errors import CannotVerify
    from shardmgr.verification.report import EXIT_CANNOT_RUN
    from shardmgr.verification.runner import count_files

    from .findings import LateProgress, show

    progress = LateProgress(count_files(data_dir) if data_dir is not None and data_dir.is_dir() else 0,
                            enabled=not as_json)
    try:
        report = _checked(data_dir, cluster, object_store, s3_endpoint, orphan_grace_s, deep, repair, progress,
                          etcd_security)
    except CannotVerify as exc:
        click.echo(f"shardmgr verify: {exc}", err=True)
        raise SystemExit(EXIT_CANNOT_RUN) from None
    except Exception:  # a failure of verify itself: "could not run", never a verdict on the data
        click.echo(f"shardmgr verify: could not run:\n{traceback.format_exc()}", err=True)
        raise SystemExit(EXIT_CANNOT_RUN) from None
    finally:
        progress.stop()
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        show(report)
    raise SystemExit(report.exit_code)


def _checked(data_dir: Path | None, cluster: str | None, object_store: str | None, s3_endpoint: str | None,
             orphan_grace_s: float | None, deep: bool, repair: bool, progress: LateProgress,
             etcd_security: EtcdSecurity) -> Report:
    """The report of the run the options ask for; CannotVerify for options that ask for none."""
    from shardmgr.errors import CannotVerify
    from shardmgr.verification.runner import verify as run
    from shardmgr.verification.runner import verify_cluster

    if data_dir is None and cluster is None:
        raise CannotVerify("give a DATA_DIR to check, or --cluster (with --object-store), or both")
    if repair and cluster is not None:
        raise CannotVerify("--repair is for a data directory only: published entries are write-once, and "
                           "the writer's own sweep removes orphan objects (docs/cluster.md)")
    report = run(data_dir, deep=deep, repair=repair, on_file=progress.advance) if data_dir is not None else None
    if cluster is not None:
        checked = verify_cluster(cluster, object_store, s3_endpoint, deep=deep, orphan_grace_s=orphan_grace_s,
                                 on_object=progress.advance, on_total=progress.expect, etcd_security=etcd_security)
        report = checked if report is None else report.joined(checked)
    assert report is not None  # (one of the two ran)
    return report
