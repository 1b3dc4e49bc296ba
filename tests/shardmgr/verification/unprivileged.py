"""Run a test step as an unprivileged user, so that file permissions apply
even when the tests run as root (CI does, and root reads any file)."""

from __future__ import annotations

import json
import os
import stat
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

NOBODY = 65534
"""uid and gid of "nobody" / "nogroup" on Debian and most Linux systems."""


def run_unprivileged(step: Callable[[], Any]) -> Any:
    """``step()``, run as uid and gid NOBODY without supplementary groups
    when this process is root (else as this user); its result, which must
    be JSON data. AssertionError with the child's traceback if it raised.

    As root the step runs in a forked child that drops its privileges: a
    fork, not a new interpreter, because the child may have no access to
    the interpreter's files. Here ``sys.executable`` is a virtualenv whose
    python links into /root/.pyenv, and /root is mode 0700: a
    ``subprocess.run(..., user=65534)`` fails with EACCES, and ``setpriv``
    only appears to work because it keeps root's capabilities through
    execve, after which the interpreter silently loads the system's
    libpython and standard library (another Python). The forked child has
    everything the parent imported; whatever ``step`` imports lazily must be
    imported by the parent first (the child cannot read the standard
    library under /root either).
    """
    if os.geteuid() != 0:
        return step()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: it must never return into pytest
        status = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            try:
                answer: dict[str, Any] = {"result": step()}
            except BaseException:
                answer = {"error": traceback.format_exc()}
            with os.fdopen(write_end, "w") as out:
                json.dump(answer, out)
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and text, f"the unprivileged child failed (status {status})"
    answer = json.loads(text)
    if "error" in answer:
        raise AssertionError(f"as uid {NOBODY}:\n{answer['error']}")
    return answer["result"]


def reachable_by_others(path: Path) -> None:
    """Assert that a user with no special rights can reach ``path``: every
    directory above it lets others through."""
    for directory in [path, *path.parents]:
        mode = directory.stat().st_mode
        assert mode & stat.S_IXOTH, f"{directory} (mode {stat.filemode(mode)}) keeps other users out"
