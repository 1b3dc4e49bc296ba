"""A user's own ``common.py`` earlier on sys.path is named at ``import
workq`` (workq/shadowing.py), with a real interpreter started in a
directory that holds one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import workq


def test_a_users_common_py_first_on_sys_path_is_named_with_the_package_it_shadows(tmp_path: Path) -> None:
    (tmp_path / "common.py").write_text("HELPER = 1\n")
    run = subprocess.run([sys.executable, "-c", "import workq"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 1
    ours = Path(workq.__file__).resolve().parents[1] / "common"
    assert run.stderr.strip().splitlines()[-1] == (
        f"ImportError: workq cannot import: the 'common' found first on sys.path is {tmp_path / 'common.py'}, not "
        f"the project's package {ours}, which it shadows; rename that module or take its directory off sys.path "
        "(a script's own directory comes first)"), run.stderr
