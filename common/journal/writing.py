"""What the writing sides of a journal (appending.py, marking.py) need of it.

:class:`~common.journal.Journal` is a chain of layers over one state, each
in its own file and each with one base class: the reading side
(reader.py), this base, marker changes (marking.py), appends
(appending.py), then the journal's lifecycle and durability (journal.py).
One base each, not mixins, so that mypyc can compile the chain (a native
class has a single base; docs/architecture.md, "The compiled build"). This
base names the state the writing sides share and the two hooks the journal
provides, so that each side states only what is its own.

Threads: the journal's owner (the thread that writes), under ``_lock``.
"""

from __future__ import annotations

from .flusher import Ticket
from .reader import RecordReader


class WritingSide(RecordReader):
    """A writing side of :class:`~common.journal.Journal` (a layer over its state)."""

    _counters: list[int]
    _seq: int

    def _check_writable(self) -> None:
        raise NotImplementedError

    def _ticket(self) -> Ticket:
        """A ticket for the journal's latest write (``_seq``)."""
        raise NotImplementedError
