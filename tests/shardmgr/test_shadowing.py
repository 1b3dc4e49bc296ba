"""A user's own ``common`` module earlier on sys.path is named at ``import
shardmgr`` (shardmgr/shadowing.py), with a real interpreter started in a
directory that holds one, as a user's script directory would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import shardmgr

OURS = Path(shardmgr.__file__).resolve().parents[1] / "common"


@pytest.mark.parametrize("theirs", ["common.py", "common/__init__.py"])
def test_a_users_common_module_first_on_sys_path_is_named_with_the_package_it_shadows(
        tmp_path: Path, theirs: str) -> None:
    (tmp_path / theirs).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / theirs).write_text("HELPER = 1\n")
    run = subprocess.run([sys.executable, "-c", "import shardmgr; shardmgr.connect('127.0.0.1:1')"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last == (f"ImportError: shardmgr cannot import: the 'common' found first on sys.path is "
                    f"{tmp_path / theirs}, not the project's package {OURS}, which it shadows; rename that module "
                    "or take its directory off sys.path (a script's own directory comes first)"), run.stderr


def test_without_a_shadowing_module_the_package_imports(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-c", "import shardmgr, workq; print(shardmgr.__version__)"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == shardmgr.__version__, run.stderr
