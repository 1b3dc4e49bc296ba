"""What the writing sides of a journal (appending.py, marking.py) need of it.

:class:`~common.journal.Journal` combines the reading side (reader.py) with
two writing sides, each a mixin over the journal's state. This base names
the state they share and the two hooks the journal provides, so that each
side states only what is its own.

Threads: the journal's owner (the thread that writes), under ``_lock``.
"""

from __future__ import annotations

import threading

from .flusher import Ticket
from .reader import RecordReader


class WritingSide(RecordReader):
    """A writing side of :class:`~common.journal.Journal` (a mixin over its state)."""

    _lock: threading.Lock
    _counters: list[int]
    _seq: int

    def _check_writable(self) -> None:
        raise NotImplementedError

    def _ticket(self) -> Ticket:
        """A ticket for the journal's latest write (``_seq``)."""
        raise NotImplementedError
