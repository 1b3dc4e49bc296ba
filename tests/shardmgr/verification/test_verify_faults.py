"""Fault injection: every kind of damage to every kind of file is found by
``verify --deep`` on the right file with the right severity, and verify
neither crashes nor hangs.

The expected severity comes from a model built from the pristine files
through the journal API alone (not from the checker): per byte of each
file, how bad a change there is (``flip``) and how bad losing it is
(``loss``), from the header layout, the record layout and what the newest
checkpoint declared durable.

Every kind of fault meets every kind of file in every run (one test case
per pair); Hypothesis picks the file of that kind and the byte, a few times
per pair in the default run and many more under the soak profile
(tests/profiles.py).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.journal.check import Severity
from common.journal.header import HEADER_SIZE, METADATA_END
from common.journal.journal import Journal
from shardmgr.store.batch_record import V1, unpack, version_of
from shardmgr.store.rows import HEADER_USED
from shardmgr.verification.runner import verify
from tests.profiles import examples
from tests.shardmgr.workload import build, file_kinds

NOTE, REPAIRABLE, CORRUPT = Severity.NOTE, Severity.REPAIRABLE, Severity.CORRUPT
JOURNALS = ("segment", "completion_log", "catalog", "shard_journal", "collection_meta", "index_meta")
ROWS = ("vectors", "ids")
DERIVED = ("index_faiss", "index_meta")  # rebuilt from the rows: damage is at most REPAIRABLE
KINDS = ("segment", "completion_log", "catalog", "shard_journal", "collection_meta", *ROWS, *DERIVED)  # file_kinds()
FAULTS = ("flip", "truncate", "garbage", "zero_page", "delete", "swap")


@dataclasses.dataclass
class Model:
    """Per byte of one file: the severity of changing it and of losing it."""

    kind: str
    flip: np.ndarray = dataclasses.field(repr=False)
    loss: np.ndarray = dataclasses.field(repr=False)


def journal_model(path: Path) -> tuple[np.ndarray, np.ndarray, int]:
    size = path.stat().st_size
    flip = np.full(size, REPAIRABLE, dtype=np.uint8)  # checkpoint slots, padding, tail past the records
    flip[:METADATA_END] = CORRUPT  # identity and metadata: under the header checksum
    loss = np.zeros(size, dtype=np.uint8)
    loss[:HEADER_SIZE] = CORRUPT
    with Journal.open(path, writable=False, recount=True) as journal:
        assert journal.recovery is not None
        durable = journal.recovery.checkpoint.end
        loss[HEADER_SIZE:durable] = CORRUPT
        for chunk in journal.scan():
            ends = chunk.ends(journal.alignment)
            for offset, length, end in zip(chunk.offsets.tolist(), chunk.lengths.tolist(), ends.tolist()):
                flip[offset:offset + 16 + length] = CORRUPT if offset < durable else REPAIRABLE
                flip[offset + 16 + length:end] = REPAIRABLE  # padding: outside the checksum, must be zero
    return flip, loss, durable


def rows_model(path: Path, row_bytes: int, rows: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """``rows``: (all rows, the rows no recovery can bring back if lost)."""
    size = path.stat().st_size
    flip = np.full(size, REPAIRABLE, dtype=np.uint8)  # header padding, tail past the rows
    flip[:HEADER_USED] = CORRUPT
    end = HEADER_SIZE + rows[1] * row_bytes
    flip[HEADER_SIZE:end] = CORRUPT
    loss = np.zeros(size, dtype=np.uint8)
    loss[:HEADER_SIZE + rows[0] * row_bytes] = REPAIRABLE
    loss[:end] = CORRUPT
    return flip, loss


def shard_rows(shard: Path, column: str) -> tuple[int, int]:
    """The shard's rows, and those of ``column`` that no recovery can bring
    back if lost: of the batches a checkpoint declared durable; none of a
    version 2 ids file (its ids are in the batch records)."""
    with Journal.open(shard / "journal", writable=False, recount=True) as journal:
        assert journal.recovery is not None
        version = version_of(msgpack.unpackb(journal.metadata), journal.path)
        batches = [(unpack(r.body, version, journal.path, r.offset), r.offset) for r in journal.records()]
        durable = [b for b, offset in batches if offset < journal.recovery.checkpoint.end]
    rows = batches[-1][0].end if batches else 0
    if column == "ids" and version != V1:
        return rows, 0
    return rows, durable[-1].end if durable else 0


class Models(dict[Path, Model]):
    def __repr__(self) -> str:  # short: hypothesis prints it with every failing case
        return f"<models of {len(self)} files>"


def build_models(root: Path) -> Models:
    models = Models()
    for kind, paths in file_kinds(root).items():
        for path in paths:
            if kind in JOURNALS:
                flip, loss, _ = journal_model(path)
            elif kind in ROWS:
                row_bytes = 8 if kind == "ids" else 8 * 4
                flip, loss = rows_model(path, row_bytes, shard_rows(path.parent, kind))
            else:
                size = path.stat().st_size
                flip, loss = np.full(size, REPAIRABLE, np.uint8), np.full(size, REPAIRABLE, np.uint8)
            if kind in DERIVED:
                flip, loss = np.minimum(flip, REPAIRABLE), np.minimum(loss, REPAIRABLE)
            models[path.relative_to(root)] = Model(kind, flip, loss)
    return models


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[Path, Model]]]:
    root = tmp_path_factory.mktemp("pristine") / "data"
    build(root)
    report = verify(root, deep=True)
    assert report.exit_code == 0, report.problems
    yield root, build_models(root)


def damage(root: Path, models: dict[Path, Model], data: st.DataObject, fault: str | None = None,
           kind: str | None = None) -> dict[Path, Severity]:
    """Apply one fault (``fault``, else a random one) to a random file (of
    ``kind``, if given; a swap's second file is any other); returns the
    expected severity per damaged file (NOTE: the fault changed nothing that
    matters)."""
    files = sorted(models)
    if fault is None:
        fault = data.draw(st.sampled_from(FAULTS))
    rel = data.draw(st.sampled_from([f for f in files if kind is None or models[f].kind == kind]))
    if fault == "swap":
        a, b = rel, data.draw(st.sampled_from([f for f in files if f != rel]))
        os.rename(root / a, root / "swap.tmp")
        os.rename(root / b, root / a)
        os.rename(root / "swap.tmp", root / b)
        return {a: swapped_in(models[a]), b: swapped_in(models[b])}
    path, model = root / rel, models[rel]
    size = len(model.flip)
    if fault == "delete":
        path.unlink()
        return {rel: REPAIRABLE if model.kind in DERIVED or model.kind == "catalog" else CORRUPT}
    if fault == "garbage":
        junk = data.draw(st.binary(min_size=1, max_size=6000).filter(any))
        with open(path, "ab") as f:
            f.write(junk)
        return {rel: REPAIRABLE}
    offset = data.draw(st.integers(0, size - 1))
    if fault == "truncate":
        os.truncate(path, offset)
        return {rel: Severity(int(model.loss[offset:].max()))}
    with open(path, "r+b") as f:
        if fault == "flip":
            f.seek(offset)
            byte = f.read(1)[0] ^ (1 << data.draw(st.integers(0, 7)))
            f.seek(offset)
            f.write(bytes([byte]))
            return {rel: Severity(int(model.flip[offset]))}
        start = offset // 4096 * 4096
        f.seek(start)
        old = np.frombuffer(f.read(4096), dtype=np.uint8)
        f.seek(start)
        f.write(bytes(len(old)))
        changed = np.flatnonzero(old) + start
        return {rel: Severity(int(model.flip[changed].max())) if len(changed) else NOTE}


def swapped_in(model: Model) -> Severity:
    """Another file's (valid) bytes in this file's place."""
    return REPAIRABLE if model.kind in DERIVED else CORRUPT


def test_the_cases_cover_every_kind_of_file(pristine: tuple[Path, dict[Path, Model]]) -> None:
    assert {model.kind for model in pristine[1].values()} == set(KINDS)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fault", FAULTS)
@settings(max_examples=examples(2, soak=40),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_every_fault_is_found_on_its_file_with_its_severity(pristine: tuple[Path, dict[Path, Model]],
                                                            tmp_path: Path, fault: str, kind: str,
                                                            data: st.DataObject) -> None:
    source, models = pristine
    root = tmp_path / "case"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(source, root)
    expected = damage(root, models, data, fault, kind)
    report = verify(root, deep=True)
    worst = max(expected.values())
    assert report.exit_code == int(worst), (expected, report.problems)
    for rel, severity in expected.items():
        if severity == NOTE:
            continue
        path = str(root / rel)
        found = [p for p in report.problems if p.path == path]
        assert any(p.severity == severity for p in found), (rel, severity, report.problems)
    # nothing else is blamed for worse than the damaged files
    # (damage to one index file makes its sibling unusable too: both are rebuilt)
    blamed = {Path(p.path).relative_to(root) for p in report.problems if p.severity == worst}
    allowed = set(expected) | {r.parent / name for r in expected if models[r].kind in DERIVED
                               for name in ("index.faiss", "index.meta")}
    assert blamed <= allowed, (expected, report.problems)
