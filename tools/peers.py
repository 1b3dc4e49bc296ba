"""The systems tools/bench_workq.py measures, by command-line name.

One module per system (tools/peer_*.py) implements the interface of
tools/peer.py; this registry is the only place that lists them.
"""

from __future__ import annotations

from peer import Peer
from peer_beanstalkd import Beanstalkd
from peer_nats import Nats
from peer_redis import Redis, RedisAlways, RedisPipelined
from peer_workq import Workq, WorkqDurable, WorkqEverySecond, WorkqOneTrip, WorkqPipelined

PEERS: dict[str, type[Peer]] = {
    "workq": Workq, "workq-1s": WorkqEverySecond, "workq-durable": WorkqDurable, "workq-pipelined": WorkqPipelined,
    "workq-one-trip": WorkqOneTrip,
    "redis": Redis, "redis-always": RedisAlways, "redis-pipelined": RedisPipelined, "beanstalkd": Beanstalkd,
    "nats": Nats,
}

# The concurrent-producers mode compares single-item enqueues, each waiting for its reply: workq's
# durable=True with Redis always, workq's group commit with Redis everysec (bench_workq pairs them).
PRODUCER_PEERS = ("workq-durable", "workq", "redis-always", "redis")


def peer(name: str) -> Peer:
    """A fresh driver for ``name``; ValueError names the known ones."""
    try:
        return PEERS[name]()
    except KeyError:
        raise ValueError(f"unknown peer {name!r}: choose from {', '.join(PEERS)}") from None
