"""A worker process for the fault tests: lease, compute, complete, forever.

Usage: python worker_child.py HOST:PORT WORKER_ID SEED
The result of a task is result_of(payload). Runs until killed.
"""

from __future__ import annotations

import random
import sys
import time

from common.wire.errors import Unavailable
from workq import Worker


def result_of(payload: bytes) -> bytes:
    return b"done:" + payload[::-1]


def main() -> None:
    address, worker_id, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = random.Random(seed)
    worker = Worker(address, worker_id, models=["m"], retry_for=120.0, timeout=30.0)
    while True:
        try:
            items = worker.lease(rng.randint(1, 25), wait=1.0)
            if rng.random() < 0.3:
                time.sleep(rng.random() * 0.05)  # "compute"
            if items and rng.random() < 0.05:
                time.sleep(1.5)  # slower than the lease: the items go to someone else, then come back late
            done = [i for i in items if rng.random() < 0.95]  # some leases are simply dropped
            if done:
                worker.complete([i.handle for i in done], [result_of(i.payload) for i in done])
        except Unavailable:
            time.sleep(0.1)  # the server is restarting: the next call reconnects and says hello


if __name__ == "__main__":
    main()
