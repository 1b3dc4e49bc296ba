"""The queue's files: what the work queue keeps on disk, and nothing else.

Owns the record layouts and file names (``records``), the input segments
(``segment``: one key's journal plus the broker's positions in it), the
per-job completion logs (``completion_log``) and the catalog of queue files
(``catalog``, an audit aid for ``verify``; recovery never obeys it).
docs/format.md describes every byte.

May import: ``common.journal``, ``workq.config``, ``workq.errors``,
``workq.protocol``; never ``workq.state``, the broker, the service or the
clients.
"""
