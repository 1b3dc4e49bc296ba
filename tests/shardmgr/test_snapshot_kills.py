"""Snapshots cut short by SIGKILL: a real ``shardmgr snapshot --data`` process,
and a real server taking one asked over the wire, each killed at chosen
points of the copy (tests/shardmgr/snapshot_child.py stops the process for
good at the N-th call of a function the snapshot makes, and the test kills
it there: deterministic, no timing).

After every kill: the source directory holds the same files, verifies clean
(``--deep``) and serves exactly the rows and queue state it had; ``DEST`` is
absent (or, killed after the rename, a whole snapshot that verifies and holds
the same); a ``DEST.tmp`` left behind is refused by every owner (the store,
the queue, the server, ``verify --repair``) and reported by ``verify``
(``incomplete_snapshot``), or, killed right after its mkdir, is empty and
reported by ``verify`` all the same, or, killed between the mark's removal
and the rename, is whole; and the same snapshot again either succeeds (and its copy
verifies and holds the same) or says clearly why not. ``shardmgr snapshot``
whose server died before answering claims success only for a DEST that
appeared during its call.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import shardmgr
import workq
from common.journal.lockfile import INCOMPLETE_NAME, IncompleteCopy
from common.wire.client import ConnectionLost, TimedOut
from common.wire.errors import ServiceError
from shardmgr.errors import CannotVerify
from tests.shardmgr import snapshot_contents as contents_of
from tests.shardmgr.server.serverproc import ServerProcess
from tests.shardmgr.snapshot_contents import Contents

ROOT = Path(__file__).resolve().parents[2]
CHILD = ("-m", "tests.shardmgr.snapshot_child")
# where the kill lands -> what it leaves: "absent" (DEST.tmp marked), "empty" (DEST.tmp empty, not marked
# yet), "unmarked" (DEST.tmp whole, mark removed: the retry refuses it), "complete" (DEST renamed into
# place, its parent not yet synced)
OFFLINE_POINTS = {
    "shardmgr.snapshots:_mark_incomplete 1": "empty",  # DEST.tmp made, its mark not yet
    "workq.disk.copies:copy_journal 2": "absent",  # the queue half copied
    "common.journal.copying:os.copy_file_range 13": "absent",  # inside the growing shard's vectors
    "shardmgr.snapshots:sync_tree 1": "absent",  # everything copied, nothing synced
    "shardmgr.snapshots:os.rename 1": "unmarked",  # synced, mark removed, not renamed
    "shardmgr.snapshots:fsync_dir 3": "complete",  # renamed, its parent not synced
}
MORE_OFFLINE_POINTS = {  # the soak's
    "common.journal.copying:os.copy_file_range 3": "absent",  # inside a queue segment
    "shardmgr.store.copies:link_or_copy 3": "absent",  # sealed shard files half linked
    "shardmgr.store.copies:copy_prefix 2": "absent",  # the growing shard's vectors copied, not its ids
}
SERVER_POINTS = {
    "workq.disk.copies:copy_journal 1": "absent",
    "shardmgr.store.copies:copy_prefix 1": "absent",
    "shardmgr.snapshots:fsync_dir 3": "complete",
}


def listing(data: Path) -> list[str]:
    return sorted(str(p.relative_to(data)) for p in data.rglob("*") if p.name != "LOCK")


def child(point: str, ready: Path, *args: str) -> list[str]:
    """The command line of a child stopping at ``point`` ("module:name N")."""
    where, n = point.split()
    return [sys.executable, *CHILD, where, n, str(ready), *args]


def wait_ready(ready: Path, proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready.exists():
        assert proc.poll() is None, f"the child ended ({proc.returncode}) before its stop: {proc.communicate()}"
        assert time.monotonic() < deadline, "the child never reached its stop"
        time.sleep(0.01)


def snapshot_again(data: Path, dest: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardmgr", "snapshot", str(dest), "--data", str(data), "--json"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def check_left(dest: Path, outcome: str, contents: Contents) -> None:
    """What the kill left at ``dest`` and ``dest.tmp`` is what ``outcome`` says."""
    building = dest.with_name(dest.name + ".tmp")
    assert dest.exists() == (outcome == "complete")
    if outcome == "complete":
        assert not building.exists()
        report = shardmgr.verify(dest, deep=True)
        assert report.exit_code == 0, report.problems
    elif outcome == "unmarked":
        assert not (building / INCOMPLETE_NAME).exists()
        assert shardmgr.verify(building, deep=True).exit_code == 0  # whole, but never renamed
    elif outcome == "empty":
        check_empty_reported(building)
    else:
        check_refused(building)


def check_empty_reported(building: Path) -> None:
    """An empty DEST.tmp (killed before its mark) is reported incomplete by verify, which changes nothing."""
    assert building.is_dir() and not any(building.iterdir())
    verified = subprocess.run([sys.executable, "-m", "shardmgr", "verify", "--deep", str(building)],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert verified.returncode == 2, verified.stdout + verified.stderr
    assert "incomplete_snapshot" in verified.stdout and "before its SNAPSHOT_INCOMPLETE mark" in verified.stdout
    with pytest.raises(CannotVerify, match="cannot complete a snapshot"):
        shardmgr.verify(building, repair=True)
    assert not any(building.iterdir())


def check_refused(building: Path) -> None:
    """A snapshot cut short is refused by every owner, which change nothing in it; verify says what it is."""
    before = listing(building)
    with pytest.raises(IncompleteCopy, match="not complete"):
        shardmgr.open(building)
    with pytest.raises(IncompleteCopy, match="not complete"):
        workq.open(building)
    with pytest.raises(CannotVerify, match="cannot complete a snapshot"):
        shardmgr.verify(building, repair=True)
    report = shardmgr.verify(building, deep=True)
    assert report.exit_code == 2
    assert "incomplete_snapshot" in [p.what for p in report.problems]  # (and whatever else is missing)
    assert listing(building) == before and not (building / "LOCK").exists()


def check_retry(retry: subprocess.CompletedProcess[str], dest: Path, outcome: str, contents: Contents) -> None:
    """The same snapshot again: done (and its copy holds ``contents``), or a clear refusal."""
    if outcome in ("absent", "empty"):
        assert retry.returncode == 0, retry.stderr
        assert not dest.with_name(dest.name + ".tmp").exists()
        report = shardmgr.verify(dest, deep=True)
        assert report.exit_code == 0, report.problems
        contents_of.check(dest, contents)
    elif outcome == "unmarked":
        assert retry.returncode == 1 and "is not a snapshot cut short" in retry.stderr, retry.stderr
    else:
        assert retry.returncode == 1 and "exists: give a new path" in retry.stderr, retry.stderr
        contents_of.check(dest, contents)


@pytest.mark.parametrize("point", sorted(OFFLINE_POINTS))
def test_an_offline_snapshot_killed_mid_copy_leaves_its_source_whole_and_no_half_copy(
        tmp_path: Path, point: str) -> None:
    kill_offline_snapshot(tmp_path, point, OFFLINE_POINTS[point])


@pytest.mark.soak
@pytest.mark.parametrize("point", sorted(MORE_OFFLINE_POINTS))
def test_an_offline_snapshot_killed_mid_copy_soak(tmp_path: Path, point: str) -> None:
    kill_offline_snapshot(tmp_path, point, MORE_OFFLINE_POINTS[point])


def kill_offline_snapshot(tmp_path: Path, point: str, outcome: str) -> None:
    data, dest, ready = tmp_path / "data", tmp_path / "snap", tmp_path / "ready"
    contents = contents_of.fill(data)
    before = listing(data)
    proc = subprocess.Popen(child(point, ready, "snapshot", str(dest), "--data", str(data)), cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_ready(ready, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    check_left(dest, outcome, contents)
    assert listing(data) == before
    report = shardmgr.verify(data, deep=True)
    assert report.exit_code == 0, report.problems
    check_retry(snapshot_again(data, dest), dest, outcome, contents)
    contents_of.check(data, contents)


@pytest.mark.parametrize("point", sorted(SERVER_POINTS))
def test_a_server_killed_while_it_takes_a_snapshot_keeps_its_data_and_leaves_no_half_copy(
        tmp_path: Path, point: str) -> None:
    data, dest, ready = tmp_path / "data", tmp_path / "snap", tmp_path / "ready"
    server = ServerProcess(data, "--config", str(_config(tmp_path)), program=child(point, ready)[1:])
    server.start()
    try:
        contents = _fill_over_the_wire(server.address)
        asked = _ask_snapshot(server.address, dest)
        assert server.proc is not None
        wait_ready(ready, server.proc)  # type: ignore[arg-type]
        server.signal(signal.SIGKILL)
        server.wait()
        asked.join(30)
        assert isinstance(asked.error, ConnectionLost) and not isinstance(asked.error, TimedOut), asked.error
    finally:
        server.kill()
    outcome = SERVER_POINTS[point]
    check_left(dest, outcome, contents)
    server = ServerProcess(data, "--config", str(_config(tmp_path))).start()  # the source serves as before
    try:
        with shardmgr.connect(server.address) as store, workq.connect(server.address) as queue:
            contents_of.check_rows(store, contents)
            assert queue.job_status(contents_of.JOB) == contents.status
        again = _ask_snapshot(server.address, dest)
        again.join(60)
        if outcome == "absent":
            assert again.error is None and again.reply is not None, again.error
        else:
            assert isinstance(again.error, ServiceError) and again.error.code == "shardmgr.cannot_snapshot", again.error
            assert "exists: give a new path" in str(again.error)
        server.signal(signal.SIGTERM)
        assert server.wait() == 0
    finally:
        server.kill()
    for directory in (data, dest):
        report = shardmgr.verify(directory, deep=True)
        assert report.exit_code == 0, (directory, report.problems)
        contents_of.check(directory, contents)


def snapshot_killed_at_hook(server: ServerProcess, dest: Path, ready: Path) -> tuple[int, str, str]:
    """``shardmgr snapshot DEST`` against ``server``, SIGKILLed once its hook wrote ``ready``: the CLI's
    exit status, stdout and stderr (the server is killed whatever happens)."""
    cli: subprocess.Popen[str] | None = None
    try:
        cli = subprocess.Popen([sys.executable, "-m", "shardmgr", "snapshot", str(dest), "--port", str(server.port)],
                               cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert server.proc is not None
        wait_ready(ready, server.proc)  # type: ignore[arg-type]
        server.signal(signal.SIGKILL)
        server.wait()
        out, err = cli.communicate(timeout=60)
        return cli.returncode, out, err
    finally:
        server.kill()
        if cli is not None and cli.poll() is None:
            cli.kill()
            cli.communicate()


@pytest.mark.parametrize("point", ["shardmgr.snapshots:fsync_dir 3", "shardmgr.store.copies:copy_prefix 1"])
def test_the_cli_tells_whether_the_snapshot_of_a_server_that_died_before_answering_is_complete(
        tmp_path: Path, point: str) -> None:
    data, dest, ready = tmp_path / "data", tmp_path / "snap", tmp_path / "ready"
    server = ServerProcess(data, "--config", str(_config(tmp_path)), program=child(point, ready)[1:]).start()
    try:
        with shardmgr.connect(server.address) as store:
            store.create_collection("c", 4)
            store.append("c", [[1.0, 2.0, 3.0, 4.0]], [7], durable=True)  # a growing shard to copy
    except BaseException:
        server.kill()
        raise
    returncode, out, err = snapshot_killed_at_hook(server, dest, ready)
    if SERVER_POINTS[point] == "complete":  # renamed into place, its parent not yet synced: whole all the same
        assert returncode == 0, err
        assert out.startswith(f"snapshot {dest}: complete and verified (the server's answer was lost: "), out
        assert shardmgr.verify(dest, deep=True).exit_code == 0
    else:
        assert returncode == 1 and not dest.exists(), out + err
        assert f"and {dest} is not here: if the server runs on this machine, the snapshot was not taken. But a " \
               "loopback --host reaches another machine's server through an SSH tunnel" in err, err
        assert f"It is complete if and only if {dest} appeared on the server's machine during the call (check " \
               f"with 'shardmgr verify {dest}' there); snap.tmp beside it is an incomplete one" in err, err


def test_the_cli_claims_no_snapshot_after_a_lost_answer_when_dest_was_there_before(tmp_path: Path) -> None:
    data, dest, ready = tmp_path / "data", tmp_path / "snap", tmp_path / "ready"
    # the second snapshot stops before the server even looks at DEST (which it would refuse: it exists)
    server = ServerProcess(data, "--config", str(_config(tmp_path)),
                           program=child("shardmgr.snapshots:Path 2", ready)[1:]).start()
    command = [sys.executable, "-m", "shardmgr", "snapshot", str(dest), "--port", str(server.port)]
    try:
        with shardmgr.connect(server.address) as store:
            store.create_collection("c", 4)
        first = subprocess.run(command, cwd=ROOT, text=True, capture_output=True, timeout=60)
        assert first.returncode == 0 and shardmgr.verify(dest).exit_code == 0, first.stderr  # a whole snapshot
    except BaseException:
        server.kill()
        raise
    returncode, out, err = snapshot_killed_at_hook(server, dest, ready)
    assert returncode == 1, out + err  # DEST is whole and verifies clean, but it is the first call's
    assert f"the server did not answer, and {dest} was here before this call, so it is not this snapshot (a " \
           "server on this machine refuses an existing destination)" in err, err


def test_a_server_will_not_serve_a_snapshot_cut_short(tmp_path: Path) -> None:
    data, dest, ready = tmp_path / "data", tmp_path / "snap", tmp_path / "ready"
    contents_of.fill(data)
    proc = subprocess.Popen(child("shardmgr.store.copies:copy_prefix 1", ready, "snapshot", str(dest), "--data",
                                  str(data)), cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_ready(ready, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    building = tmp_path / "snap.tmp"
    served = subprocess.run([sys.executable, "-m", "shardmgr", "serve", "--data", str(building), "--port", "0"],
                            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert served.returncode != 0 and "is a snapshot that is not complete" in served.stderr, served.stderr
    check_refused(building)


class _Asked(threading.Thread):
    """A ``snapshot`` request over the wire, on its own thread (it may never be answered)."""

    def __init__(self, address: str, dest: Path) -> None:
        super().__init__(daemon=True)
        self.address, self.dest = address, dest
        self.reply: object = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with shardmgr.connect(self.address, timeout=60) as client:
                self.reply = client.rpc.call("snapshot", {"dest": str(self.dest)}).result
        except BaseException as exc:  # reported by the test
            self.error = exc


def _ask_snapshot(address: str, dest: Path) -> _Asked:
    asked = _Asked(address, dest)
    asked.start()
    return asked


def _fill_over_the_wire(address: str) -> Contents:
    contents = Contents()
    with shardmgr.connect(address) as store, workq.connect(address) as queue, \
            workq.Worker(address, "w", models=["m"]) as worker:
        contents_of.fill_store(store, contents)
        contents_of.fill_queue(queue, worker.lease, worker.complete, contents)
    return contents


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "server.toml"
    config.write_text(f"[store]\nseal_bytes = {contents_of.SEAL_BYTES}\nrewrite_live_fraction = 0.0\n"
                      "merge_below_fraction = 0.0\n\n[workq]\nsegment_bytes = 65536\nreconnect_window_s = 0.0\n"
                      "disk_floor_bytes = 0\n")
    return config
