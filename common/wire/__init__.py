"""The wire layer: how a server and its clients talk.

Owns the binary framing (``framing``: preamble, frames of a msgpack header
and raw array parts), the client base with reconnects and pipelining
(``client``; opening a connection, TLS and token included: ``dialer``),
the contract between the server and the components it hosts
(``component``), the byte budget that bounds what frames still arriving
may hold (``budget``) and their deadlines (``deadlines``), the errors that cross the wire with a stable code
(``errors``), TLS contexts for both ends (``tls``) and which hosts are
loopback (``hosts``). docs/protocol.md
describes the protocol, docs/security.md tokens and TLS.

May import: ``common.errors``, ``common.units``; never ``common.journal``,
``workq`` or ``shardmgr``.
"""
