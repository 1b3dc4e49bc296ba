"""Test kit: crash an embedded broker the way kill -9 would.

``crash(broker)`` stops the owner and the flusher without another
flush and abandons every journal: nothing written after the last completed
flush is made durable. Combine with common.testing.PowerCut to also lose the
page cache.
"""

from __future__ import annotations

from .broker import Broker


def crash(broker: Broker) -> None:
    broker.abandon()
