"""Thread switches per one-item call: what the server's threads cost a request besides its instructions.

Starts ``shardmgr serve`` (tools/peer_workq.py) on loopback, then for each
phase counts, over the phase only, the server's context switches and,
when ``perf`` is installed and allowed, its futex, sendmsg, recvfrom,
pwrite64 and fdatasync calls (``perf stat -e
context-switches,syscalls:sys_enter_*``), per call. Without perf the
switches come from /proc (voluntary and involuntary, summed over the
threads alive at the phase's end: a connection's reader that exited with
its worker is missed, so the work phase's count is low):

* ``durable-enqueue``: one producer, one durable one-item enqueue per call;
* ``enqueue``: the same with group commit;
* ``work``: 2 worker processes, each leasing one item and completing it
  (``durable`` as ``--durable-complete``), per work item (two calls).

Every phase runs ``--runs`` times on a fresh server, interleaved with the
others; printed: the median and min-max of each count per call. Counts are
steadier than seconds on a shared machine (server CPU per call is printed
beside them); callgrind's instruction counts (``bench_workq.py
--callgrind``) do not see switches at all.

    PYTHONPATH=. python tools/bench_switches.py --runs 3
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
from peer_workq import Workq

import workq

SYSCALLS = ("futex", "sendmsg", "recvfrom", "pwrite64", "fdatasync")
PAYLOAD = 512
RESULT = 256


def _switches(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


class Counting:
    """The server's switches, CPU seconds and (with perf) syscalls between start and stop."""

    def __init__(self, pid: int, out: Path) -> None:
        self.pid, self.out = pid, out
        self.proc = psutil.Process(pid)
        self.perf: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if shutil.which("perf"):
            events = ",".join(["context-switches", *(f"syscalls:sys_enter_{name}" for name in SYSCALLS)])
            self.perf = subprocess.Popen(["perf", "stat", "-x", ",", "-e", events, "-p", str(self.pid),
                                          "-o", str(self.out)], stderr=subprocess.DEVNULL)
            time.sleep(0.3)  # perf attaches
        self.switches, cpu = _switches(self.pid), self.proc.cpu_times()
        self.cpu = cpu.user + cpu.system

    def stop(self, calls: int) -> dict[str, float]:
        cpu = self.proc.cpu_times()
        counts = {"switches": (_switches(self.pid) - self.switches) / calls,
                  "server CPU µs": (cpu.user + cpu.system - self.cpu) / calls * 1e6}
        if self.perf is not None:
            self.perf.send_signal(signal.SIGINT)
            self.perf.wait()
            for line in self.out.read_text().splitlines():
                fields = line.split(",")
                if len(fields) > 2 and fields[0].isdigit():  # a count of every thread, exited ones too
                    name = "switches" if fields[2] == "context-switches" else fields[2]
                    counts[name.removeprefix("syscalls:sys_enter_")] = int(fields[0]) / calls
        return counts


def _worker(address: str, index: int, durable: bool, done: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    result, got = os.urandom(RESULT), 0
    with workq.Worker(address, f"w{index}", models=["m"]) as worker:
        while items := worker.lease(1, wait=0.2):
            worker.complete(items[0].handle, result, durable)
            got += 1
    done.put(got)


def run_phase(phase: str, items: int, durable_complete: bool, base: Path) -> dict[str, float]:
    server = Workq()
    server.start(base)
    try:
        counting = Counting(server.proc.pid, base / "perf.csv")
        payload = [os.urandom(PAYLOAD)]
        with workq.connect(server.address) as client:
            durable = phase == "durable-enqueue"
            for _ in range(200):  # warm-up: connections, the job's files
                client.enqueue("job", "m", "s", 1, payload, durable=durable)
            if phase != "work":
                counting.start()
                for _ in range(items):
                    client.enqueue("job", "m", "s", 1, payload, durable=durable)
                return counting.stop(items)
            for _ in range(items - 200):
                client.enqueue("job", "m", "s", 1, payload)
        counting.start()
        done: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
        workers = [multiprocessing.Process(target=_worker, args=(server.address, i, durable_complete, done))
                   for i in range(2)]
        for w in workers:
            w.start()
        got = sum(done.get(timeout=600) for _ in workers)
        for w in workers:
            w.join()
        return counting.stop(got)
    finally:
        server.proc.terminate()
        server.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--phases", default="durable-enqueue,enqueue,work")
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--durable-complete", action="store_true", help="work: complete with durable=True")
    args = parser.parse_args()
    phases = args.phases.split(",")
    seen: dict[str, list[dict[str, float]]] = {phase: [] for phase in phases}
    root = Path(os.environ.get("BENCH_DIR", "."))
    for round_ in range(args.runs):
        for phase in phases:
            base = Path(tempfile.mkdtemp(prefix="bench-switches-", dir=root))
            try:
                seen[phase].append(run_phase(phase, args.items, args.durable_complete, base))
            finally:
                shutil.rmtree(base, ignore_errors=True)
            print(f"round {round_ + 1}/{args.runs}: {phase}", flush=True)
    for phase, runs in seen.items():
        unit = "work item (2 calls)" if phase == "work" else "call"
        print(f"{phase}, per {unit}, median [min-max] of {len(runs)}:")
        for key in runs[0]:
            values = [run[key] for run in runs if key in run]
            print(f"  {key:>14}: {statistics.median(values):8.2f} [{min(values):.2f}-{max(values):.2f}]")


if __name__ == "__main__":
    main()
