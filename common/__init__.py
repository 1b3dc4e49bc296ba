"""What the queue and the vector store share; knows nothing of either.

* :mod:`common.journal`: the append-only, checksummed, group-committed
  journal files both products store everything in, their recovery and
  offline check, the directory lock, and (``common.journal.testing``) the
  power-cut simulator.
* :mod:`common.wire`: the binary framing, the client base and the
  component contract a server hosts.
* :mod:`common.errors` (the root error), :mod:`common.units` (byte units),
  :mod:`common.crc` (crc32c of a whole from its pieces) and
  :mod:`common.exports` (a package's public names, loaded on first use).

May import: the standard library and third-party packages only. ``journal``
and ``wire`` do not import each other.
"""

PROJECT = "shardmgr"
"""Marks this package as the project's: ``shardmgr`` and ``workq`` check it at
import, so that a user's own ``common`` module earlier on ``sys.path`` (which
shadows this one) is named in their ImportError, not left to a puzzling
``No module named 'common.journal'``."""
