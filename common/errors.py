"""The root of every error the ``common`` package raises: :class:`CommonError`.

Two families sit under it, each beside the code that raises it:
``common.journal.errors`` (:class:`~common.journal.errors.JournalError`, the
journal layer) and ``common.wire.errors``
(:class:`~common.wire.errors.ServiceError`, errors that cross the wire with
a stable code). Errors that describe bad caller input also inherit the
matching builtin (``ValueError``, ``KeyError``) so generic handlers still
catch them; errors that wrap an operating-system failure keep it as
``__cause__``.
"""

from __future__ import annotations


class CommonError(Exception):
    """Root of every error raised by the ``common`` package."""
