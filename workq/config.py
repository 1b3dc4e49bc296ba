"""The work queue's configuration: one frozen dataclass, units in the names."""

from __future__ import annotations

import dataclasses
import math

from common.units import GiB, MiB

#: Bytes of a segment that cannot hold payloads: its 4 KiB header plus
#: slack for record headers and padding.
SEGMENT_OVERHEAD = 8192
#: Bytes a lease or results response spends per item besides its payload
#: (handle, position, length, delivery count, indexes), rounded up.
REPLY_ITEM_BYTES = 64
#: ... per batch of items (a lease lists each batch's job and key names).
REPLY_BATCH_BYTES = 32 * REPLY_ITEM_BYTES
#: ... and once, for the response's header.
REPLY_SLACK_BYTES = 4096

@dataclasses.dataclass(frozen=True, slots=True)
class WorkqConfig:
    """Settings of a broker. ``validate()`` checks them."""

    #: An input segment (or a completion-log segment) is sealed at this size.
    segment_bytes: int = 256 * MiB
    #: ... or after this many seconds without an append.
    idle_seal_s: float = 60.0
    #: Largest task payload accepted by enqueue, in bytes (a payload must
    #: also fit in one segment with its record overhead and, in a server, in
    #: one response frame: see fitted_to_frame).
    max_payload_bytes: int = 16 * MiB
    #: Largest result payload accepted by complete, in bytes (the same caps apply).
    max_result_bytes: int = 64 * MiB
    #: Seconds a lease lasts unless the worker touches it.
    lease_s: float = 300.0
    #: Deliveries after which an item that comes back is buried.
    max_deliveries: int = 5
    #: Seconds after a worker's connection drops before its leases are
    #: reclaimed (a worker reconnecting within it keeps them).
    disconnect_grace_s: float = 30.0
    #: Seconds after a broker start during which items recovered from disk
    #: are not dispatched, so reconnecting workers can report what they hold.
    reconnect_window_s: float = 30.0
    #: Enqueue is refused while free disk space is below this many bytes; the
    #: space left is reserved for results, so completions do not fail on it.
    disk_floor_bytes: int = 1 * GiB
    #: Most items one lease may return.
    max_lease_items: int = 100_000
    #: Seconds a *waiting* results call lingers after new results appear,
    #: to take the ones that follow in the same response (as Kafka's
    #: fetch.max.wait): one response per result would cost the server more
    #: than the result when items complete one at a time. 0: answer at once.
    #: A results call that finds results when it arrives answers at once.
    results_linger_s: float = 0.005

    @property
    def payload_limit(self) -> int:
        """Largest task payload enqueue accepts: the setting, or what one segment holds."""
        return min(self.max_payload_bytes, self.segment_bytes - SEGMENT_OVERHEAD)

    @property
    def result_limit(self) -> int:
        """Largest result complete accepts: the setting, or what one segment holds."""
        return min(self.max_result_bytes, self.segment_bytes - SEGMENT_OVERHEAD)

    @staticmethod
    def reply_bytes(max_frame_bytes: int) -> int:
        """Bytes of payloads (plus REPLY_ITEM_BYTES each, REPLY_BATCH_BYTES
        per batch) one lease or results response may carry to fit a frame."""
        return max_frame_bytes - REPLY_SLACK_BYTES

    def fitted_to_frame(self, max_frame_bytes: int) -> WorkqConfig:
        """This config with payload and result limits lowered, if need be,
        so that one of each fits a response frame of ``max_frame_bytes``."""
        room = self.reply_bytes(max_frame_bytes) - REPLY_ITEM_BYTES - REPLY_BATCH_BYTES
        if room < 1:
            raise ValueError(f"max_frame_bytes ({max_frame_bytes}) leaves no room for a payload")
        return dataclasses.replace(self, max_payload_bytes=min(self.max_payload_bytes, room),
                                   max_result_bytes=min(self.max_result_bytes, room))

    def validate(self) -> WorkqConfig:
        """Return self, or raise ValueError naming the bad setting."""
        if not 64 * 1024 <= self.segment_bytes <= 32 * GiB:
            raise ValueError(f"segment_bytes must be in 64 KiB..32 GiB, got {self.segment_bytes}")
        for name in ("idle_seal_s", "lease_s"):
            if not 0 < getattr(self, name) < math.inf:  # also NaN
                raise ValueError(f"{name} must be a positive, finite number of seconds, got {getattr(self, name)}")
        for name in ("disconnect_grace_s", "reconnect_window_s"):
            if not 0 <= getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {getattr(self, name)}")
        if not 0 <= self.results_linger_s <= 1:
            raise ValueError(f"results_linger_s must be in 0..1 seconds, got {self.results_linger_s}")
        if self.disk_floor_bytes < 0:
            raise ValueError(f"disk_floor_bytes must be >= 0, got {self.disk_floor_bytes}")
        if self.max_payload_bytes < 1:
            raise ValueError(f"max_payload_bytes must be >= 1, got {self.max_payload_bytes}")
        if not 0 <= self.max_result_bytes <= 2**28 - 64:
            raise ValueError(f"max_result_bytes must be below 256 MiB, got {self.max_result_bytes}")
        if self.max_deliveries < 1 or self.max_lease_items < 1:
            raise ValueError("max_deliveries and max_lease_items must be >= 1")
        return self
