"""TLS contexts for both ends of a connection (stdlib :mod:`ssl`).

The server presents a certificate and may require client certificates
signed by a given CA (mutual TLS); the client verifies the server's
certificate and host name against a CA file, or the system's CAs. Both
sides refuse anything older than TLS 1.2. TLS wraps the whole connection,
preamble included (docs/security.md says what it covers).
"""

from __future__ import annotations

import ssl
from pathlib import Path

StrPath = str | Path


def server_context(cert: StrPath, key: StrPath, client_ca: StrPath | None = None) -> ssl.SSLContext:
    """A server-side context; with ``client_ca``, clients must present a
    certificate that CA signed. ValueError naming the file if one cannot be loaded."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # A stopping server shuts the read side of its sockets and still writes the
    # replies in flight; without this OpenSSL 3 takes the EOF as fatal, sends an
    # alert and refuses those writes. Frames carry their length, so a stream cut
    # inside a frame is still detected; one cut between frames is a close.
    context.options |= getattr(ssl, "OP_IGNORE_UNEXPECTED_EOF", 0)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load the TLS certificate {cert} with key {key}: {exc}") from exc
    if client_ca is not None:
        try:
            context.load_verify_locations(cafile=client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cannot load the client CA file {client_ca}: {exc}") from exc
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(ca: StrPath | None = None, cert: StrPath | None = None,
                   key: StrPath | None = None) -> ssl.SSLContext:
    """A client-side context that verifies the server against ``ca`` (default:
    the system's CAs) and its host name; ``cert``/``key`` is the client's own
    certificate for servers that require one. ValueError naming a file that cannot be loaded."""
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load the CA file {ca}: {exc}") from exc
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None:
        try:
            context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cannot load the client certificate {cert} with key {key}: {exc}") from exc
    return context
