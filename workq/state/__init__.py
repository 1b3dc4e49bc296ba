"""The queue's in-memory state machine, run under the broker's owner lock.

Owns the queue of one data directory (``queue``: segments, completion logs,
jobs), every item-state transition and its counts (``items``), the lease
table (``lease_table``), dispatch planning (``dispatch``), leasing and
completing (``leasing``, ``completion``), start-up from the markers
(``recovery``), deleting finished files (``collector``) and the operator
view (``stats``). Nothing here locks: one thread makes every call.

May import: ``common.journal``, ``common.wire.errors``, ``workq.disk``,
``workq.config``, ``workq.errors``, ``workq.protocol``; never the broker,
the service or the clients.
"""
