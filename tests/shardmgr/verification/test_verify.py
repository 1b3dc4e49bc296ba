"""``shardmgr verify`` through its public interfaces: ``shardmgr.verify()``
and the CLI (exit codes, ``--json``, ``--repair``), on a directory written
by a real workload."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardmgr
import workq
from common.journal.check import Severity
from common.journal.lockfile import LockFile
from shardmgr.cli import main
from shardmgr.errors import CannotVerify, UnknownRef
from tests.profiles import examples
from tests.shardmgr.store.test_store import digest
from tests.shardmgr.workload import Workload, build

from .test_verify_faults import FAULTS, Model, build_models, damage
from .unprivileged import NOBODY, reachable_by_others, run_unprivileged


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Workload, dict[Path, Model]]]:
    root = tmp_path_factory.mktemp("verify") / "data"
    workload = build(root)
    yield root, workload, build_models(root)


@pytest.fixture
def copy(pristine: tuple[Path, Workload, dict[Path, Model]], tmp_path: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(pristine[0], root)
    return root


def test_a_real_workload_verifies_clean(copy: Path) -> None:
    before = digest(copy)
    for deep in (False, True):
        report = shardmgr.verify(copy, deep=deep)
        assert report.exit_code == 0 and report.problems == [], report.problems
        assert report.files == sum(1 for p in copy.rglob("*") if p.is_file() and p.name != "LOCK")
    assert report.bytes_read > 2 << 20
    assert digest(copy) == before  # read-only: not a byte changed


def test_cli_exit_codes_and_json(copy: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["verify", str(copy)])
    assert result.exit_code == 0 and "clean" in result.output.lower(), result.output
    result = runner.invoke(main, ["verify", "--deep", "--json", str(copy)])
    assert result.exit_code == 0
    assert json.loads(result.output)["counts"] == {"note": 0, "repairable": 0, "corrupt": 0}

    segment = sorted((copy / "workq" / "segments").iterdir())[0]
    with open(segment, "ab") as f:  # a torn tail: recovery cuts it
        f.write(b"\x01" * 100)
    report = json.loads(runner.invoke(main, ["verify", "--json", str(copy)]).output)
    assert report["exit_code"] == 1
    [problem] = report["problems"]
    assert problem["path"] == str(segment) and problem["severity"] == "repairable"
    assert {"offset", "expected", "found", "what"} <= set(problem)

    vectors = copy / "shards" / "flat" / "00000001" / "vectors"
    with open(vectors, "r+b") as f:  # a flipped bit in a sealed shard's rows
        f.seek(5000)
        byte = f.read(1)
        f.seek(5000)
        f.write(bytes([byte[0] ^ 4]))
    damaged = digest(copy)
    assert runner.invoke(main, ["verify", str(copy)]).exit_code == 1  # the default run reads no rows
    result = runner.invoke(main, ["verify", "--deep", str(copy)])
    assert result.exit_code == 2 and "rows_checksum" in result.output, result.output
    assert digest(copy) == damaged  # without --repair nothing is touched, damaged or not

    assert runner.invoke(main, ["verify", str(tmp_path / "nope")]).exit_code == 3
    assert runner.invoke(main, ["verify", str(vectors)]).exit_code == 3


def test_repair_refuses_a_directory_a_server_holds(copy: Path) -> None:
    with open(copy / "workq" / "segments" / "0000000003.wqsg", "ab") as f:
        f.write(b"junk")  # something a repair would cut
    before = digest(copy)
    lock = LockFile(copy)
    lock.acquire()
    try:
        with pytest.raises(CannotVerify, match="to itself"):
            shardmgr.verify(copy, repair=True)
        assert shardmgr.verify(copy).exit_code == 1  # a read-only run does not need the lock
        assert digest(copy) == before  # the refused repair changed nothing
    finally:
        lock.release()
    result = subprocess.run([sys.executable, "-c", "from shardmgr.cli import main; main()", "verify", "--repair",
                             str(copy)],
                            capture_output=True, text=True, timeout=120, cwd=copy.parent)
    assert result.returncode == 0, result.stderr  # the lock is free again


@pytest.fixture
def open_copy(pristine: tuple[Path, Workload, dict[Path, Model]]) -> Iterator[Path]:
    """A copy of the workload's directory that any user can reach (pytest's
    own temporary directories are private to the user running it)."""
    parent = Path(tempfile.mkdtemp(prefix="shardmgr-verify-"))
    parent.chmod(0o755)
    root = parent / "data"
    shutil.copytree(pristine[0], root)
    try:
        yield root
    finally:
        for path in [root, *root.rglob("*")]:
            if not path.is_symlink():
                path.chmod(0o755 if path.is_dir() else 0o644)
        shutil.rmtree(parent)


def verify_cli(root: Path) -> list[Any]:
    """``shardmgr verify ROOT``: [exit status, output]."""
    result = CliRunner().invoke(main, ["verify", str(root)])
    return [result.exit_code, result.output]


@pytest.mark.parametrize("unreadable", ["shards", "shards/flat/00000001/vectors"])
def test_what_cannot_be_read_cannot_be_verified(open_copy: Path, unreadable: str) -> None:
    reachable_by_others(open_copy)
    assert run_unprivileged(os.geteuid) == (NOBODY if os.geteuid() == 0 else os.geteuid())
    assert verify_cli(open_copy)[0] == 0  # as root: clean (and every module verify loads is loaded)
    assert run_unprivileged(lambda: verify_cli(open_copy))[0] == 0  # the unprivileged user reads it all
    target = open_copy / unreadable
    target.chmod(0)
    status, output = run_unprivileged(lambda: verify_cli(open_copy))
    assert status == 3 and f"cannot read {target}: Permission denied" in output, output


def served_rows(root: Path, workload: Workload) -> None:
    """Every row of a shard not quarantined is served, bit for bit (its shard
    may have been merged into another since: its refs still work); rows of
    quarantined shards are refused as unknown."""
    with shardmgr.open(root) as store:
        for name, rows in workload.vectors.items():
            if name not in store.collections():
                assert (root / "quarantine" / "shards").is_dir()  # its metadata was damaged: moved aside
                continue
            refs = np.array(sorted(rows), dtype=np.int64)
            shards = refs >> 40
            for shard in np.unique(shards).tolist():
                mine = refs[shards == shard]
                if list((root / "shards" / name / "quarantine").glob(f"{shard:08d}-*")):
                    with pytest.raises(UnknownRef):
                        store.get(name, mine[:1])
                    continue
                want = np.stack([rows[r][0] for r in mine.tolist()])
                np.testing.assert_array_equal(store.get(name, mine), want)
                assert store.ids(name, mine).tolist() == [rows[r][1] for r in mine.tolist()]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("fault", FAULTS)  # every kind of fault in every run; the file and byte are drawn
@settings(max_examples=examples(2, soak=70),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_repair_leaves_a_clean_directory_that_serves_every_undamaged_row(
        pristine: tuple[Path, Workload, dict[Path, Model]], tmp_path: Path, fault: str, data: st.DataObject) -> None:
    source, workload, models = pristine
    root = tmp_path / "case"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(source, root)
    damage(root, models, data, fault)
    report = shardmgr.verify(root, deep=True, repair=True)
    assert all(p.severity == Severity.NOTE for p in report.problems), (report.repaired, report.problems)
    assert all(p.what in ("quarantined", "lost") for p in report.problems), report.problems
    served_rows(root, workload)
    with workq.open(root, reconnect_window_s=0.0, disk_floor_bytes=0) as broker:
        for job in workload.jobs:
            if not any(broker.job_status(job).values()):  # every file of the job was quarantined
                assert any(p.what in ("quarantined", "lost") and "/workq" in p.path for p in report.problems)
    assert shardmgr.verify(root, deep=True).exit_code == 0


def test_errors_of_the_moment_stop_the_run_and_move_nothing(copy: Path) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    held: list[int] = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    try:
        for fd in held[-2:]:
            os.close(fd)
        del held[-2:]
        with pytest.raises(CannotVerify, match="nothing concluded|Too many open files"):
            shardmgr.verify(copy, repair=True)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert not (copy / "quarantine").exists() and not list(copy.glob("shards/*/quarantine"))
    assert shardmgr.verify(copy).exit_code == 0


@pytest.mark.timeout(60)
def test_a_fifo_in_a_files_place_is_reported_not_waited_on(copy: Path) -> None:
    for path in (copy / "workq" / "catalog.wqct", copy / "shards" / "flat" / "00000001" / "vectors"):
        path.unlink()
        os.mkfifo(path)
    report = shardmgr.verify(copy, deep=True)
    assert {(Path(p.path).name, p.what) for p in report.problems} >= {("catalog.wqct", "header"),
                                                                       ("vectors", "row_header")}


def test_repair_that_cannot_lock_cannot_run(copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: LockFile) -> None:
        raise PermissionError(13, "Permission denied", str(copy / "LOCK"))

    monkeypatch.setattr(LockFile, "acquire", refuse)
    assert CliRunner().invoke(main, ["verify", "--repair", str(copy)]).exit_code == 3


def test_the_progress_bar_shows_only_on_a_terminal(copy: Path) -> None:
    import io

    from rich.console import Console

    from shardmgr.cli.findings import LateProgress
    from shardmgr.verification.runner import count_files

    for terminal in (True, False):
        out = io.StringIO()
        progress = LateProgress(count_files(copy), enabled=True, delay=0.0,
                                console=Console(file=out, force_terminal=terminal, width=100))
        report = shardmgr.verification.runner.verify(copy, on_file=progress.advance)
        progress.stop()
        assert report.files == count_files(copy)
        assert ("verify" in out.getvalue()) == terminal


def test_a_thread_limit_is_not_a_verdict(copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(ThreadPoolExecutor, "submit", refuse)
    assert CliRunner().invoke(main, ["verify", "--deep", str(copy)]).exit_code == 3


def test_check_failed_alone_means_not_everything_was_checked(copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shardmgr.verification.shard_checks

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("a rule no check foresaw")

    monkeypatch.setattr(shardmgr.verification.shard_checks, "_shard", broken)
    report = shardmgr.verify(copy)
    assert {p.what for p in report.problems} == {"check_failed"} and report.exit_code == 3


@pytest.mark.timeout(60)
def test_a_fifo_in_quarantine_does_not_block(copy: Path) -> None:
    moved = copy / "shards" / "flat" / "quarantine" / "00000009-20260101T000000"
    moved.mkdir(parents=True)
    os.mkfifo(moved / "QUARANTINED")
    report = shardmgr.verify(copy)
    assert [p.what for p in report.problems] == ["quarantined"]


def damage_for_repair(root: Path) -> None:
    """One of each kind of work for repair: a corrupt sealed shard (quarantine), a corrupt queue
    segment (quarantine, bury), stray bytes after a sealed journal (cut), a damaged index (rebuild)."""
    with open(root / "shards" / "flat" / "00000001" / "vectors", "r+b") as f:
        f.seek(5000)
        f.write(b"\xff\xff")
    segment = sorted((root / "workq" / "segments").glob("*.wqsg"))[0]
    with open(segment, "r+b") as f:
        f.seek(100)
        f.write(b"\x01")
    with open(root / "shards" / "flat" / "00000002" / "journal", "ab") as f:
        f.write(b"junk")
    with open(root / "shards" / "graph" / "00000001" / "index.faiss", "r+b") as f:
        f.seek(1000)
        f.write(b"\x00\x01\x02")


def kill_repairs(pristine: tuple[Path, Workload, dict[Path, Model]], tmp_path: Path, lives: int) -> None:
    """SIGKILL a real ``verify --repair`` process at random points, ``lives``
    times; a second repair then finishes the work, and every undamaged row is
    still served."""
    import random
    import signal
    import time

    source, workload, _ = pristine
    command = [sys.executable, "-c", "from shardmgr.cli import main; main()", "verify", "--deep", "--repair"]
    cwd = tmp_path  # not tests/: its common/ would shadow the package
    timing = tmp_path / "timing"
    shutil.copytree(source, timing)
    damage_for_repair(timing)
    started = time.monotonic()
    subprocess.run([*command, str(timing)], capture_output=True, timeout=120, cwd=cwd)
    whole = time.monotonic() - started  # a cold first run can take longer than the runs below: kill early enough
    rng = random.Random(5)
    killed = 0
    for life in range(lives):
        root = tmp_path / f"life{life}"
        shutil.copytree(source, root)
        damage_for_repair(root)
        proc = subprocess.Popen([*command, str(root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
        time.sleep(rng.uniform(0.15, 0.6) * whole)
        proc.send_signal(signal.SIGKILL)
        killed += proc.wait() == -signal.SIGKILL
        report = shardmgr.verify(root, deep=True, repair=True)
        assert all(p.severity == Severity.NOTE for p in report.problems), (life, report.repaired, report.problems)
        served_rows(root, workload)
        assert shardmgr.verify(root, deep=True).exit_code == 0
        shutil.rmtree(root)
    assert killed >= lives // 2  # most kills landed in the middle of a repair


@pytest.mark.timeout(600)
def test_a_repair_killed_at_any_point_loses_nothing(pristine: tuple[Path, Workload, dict[Path, Model]],
                                                    tmp_path: Path) -> None:
    kill_repairs(pristine, tmp_path, lives=4)


@pytest.mark.soak
@pytest.mark.timeout(1800)
def test_a_repair_killed_at_any_point_loses_nothing_soak(pristine: tuple[Path, Workload, dict[Path, Model]],
                                                         tmp_path: Path) -> None:
    kill_repairs(pristine, tmp_path, lives=60)
