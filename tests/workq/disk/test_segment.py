"""A segment's one-item paths (workq/disk/segment.py) read what its general paths read."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import workq
from common.journal import Flusher, Marker
from workq.config import WorkqConfig
from workq.protocol import unpack
from workq.state.queue import QueueState
from workq.state.recovery import recover

KEY = workq.Key("m", "s", "1")


def test_the_heads_of_a_few_held_items_are_the_general_read(tmp_path: Path, flusher: Flusher) -> None:
    state = QueueState(tmp_path / "workq", WorkqConfig(disk_floor_bytes=0), flusher)
    recover(state)
    first, _ = state.enqueue("alpha", KEY, [b"a", b"bb"])
    second, _ = state.enqueue("beta", KEY, [b"c" * 300])
    [segment] = state.segments.values()
    offsets = np.concatenate([unpack(first)[1], unpack(second)[1]])
    segment.journal.set_markers(offsets[1:2], Marker.RETIRED)
    for part in (offsets[:1], offsets[1:], offsets):
        few = segment.heads_of(part, proven=True)  # held items: the plain reads
        general = segment.heads_of(part)
        assert [(a.dtype, a.tolist()) for a in few] == [(b.dtype, b.tolist()) for b in general]
    jobs, positions, markers = segment.heads_of(offsets, proven=True)
    assert len(set(jobs.tolist())) == 2 and positions.tolist() == [0, 1, 0]
    assert markers.tolist() == [int(Marker.LIVE), int(Marker.RETIRED), int(Marker.LIVE)]
