"""Child process for the SIGKILL test: appends, re-marks and reports what is durable.

Usage: python journal_child.py PATH SEED LIFE

Prints one line per confirmed-durable event, flushed immediately:
  ``A <life> <batch> <first_offset> <count>``  a batch whose ticket is durable
  ``M <offset>``                               a LIVE -> RETIRED change that is durable
Runs until killed.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from common.journal import Flusher, FlusherConfig, Journal, JournalConfig, Marker

CONFIG = JournalConfig(extent_bytes=1 << 20)


def bodies_for(seed: int, life: int, batch: int) -> list[bytes]:
    """The deterministic bodies of one batch (the parent regenerates them)."""
    rng = random.Random(f"{seed}/{life}/{batch}")
    return [rng.randbytes(rng.choice((0, 1, 13, 100, 512, 4000, 70_000))) for _ in range(rng.randint(1, 20))]


def main() -> None:
    path, seed, life = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(f"{seed}/{life}")
    flusher = Flusher(FlusherConfig(interval=0.002)).start()
    if path.exists():
        journal = Journal.open(path, kind=b"KILL", flusher=flusher, config=CONFIG)
    else:
        journal = Journal.create(path, kind=b"KILL", flusher=flusher, config=CONFIG)
    live: list[int] = []
    batch = 0
    while True:
        bodies = bodies_for(seed, life, batch)
        offsets, ticket = journal.append_batch(bodies)
        retire = rng.sample(live, min(len(live), rng.randint(0, 3)))
        mark_ticket = journal.set_markers(retire, Marker.RETIRED, expect=Marker.LIVE) if retire else None
        if rng.random() < 0.7:  # sometimes let several writes share one flush
            journal.wait_durable(ticket)
            lines = [f"A {life} {batch} {int(offsets[0])} {len(offsets)}"]
            if mark_ticket is not None:
                journal.wait_durable(mark_ticket)
                lines += [f"M {off}" for off in retire]
                live = [o for o in live if o not in retire]
            sys.stdout.write("\n".join(lines) + "\n")
            sys.stdout.flush()
            live.extend(int(o) for o in offsets)
        elif mark_ticket is not None:
            live = [o for o in live if o not in retire]
        batch += 1


if __name__ == "__main__":
    main()
