"""Throwaway TLS files for tests and benchmarks: a CA, a server certificate
for localhost/127.0.0.1 and a client certificate, all signed by the CA
(the ``cryptography`` package, in the [test] extra)."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclasses.dataclass(frozen=True)
class Pki:
    """Paths of the PEM files ``make_pki`` wrote."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    #: the CA's own key (client_certificate signs more with it)
    ca_key: Path | None = None


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)] if common_name else [])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def _issue(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, issuer_key: ec.EllipticCurvePrivateKey,
           *, ca: bool = False, server: bool = False, peer: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                      content_commitment=False, key_encipherment=False,
                                                      data_encipherment=False, key_agreement=False,
                                                      encipher_only=False, decipher_only=False), critical=True)
        builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        if peer or not server:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(directory: Path, prefix: str = "", *, peer: bool = False, client_name: str = "test client") -> Pki:
    """Write a fresh CA, server and client certificate and keys into ``directory``. ``peer``: the server's
    certificate is also good for client authentication (etcd's HTTP gateway presents it to etcd's own gRPC
    port when clients must show certificates, and fails without it). ``client_name``: the client
    certificate's common name ("": none, as etcd's gateway wants once auth is on)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _issue(f"{prefix}test CA", ca_key, _name(f"{prefix}test CA"), ca_key, ca=True)
    pki = Pki(*(directory / f"{prefix}{n}.pem" for n in ("ca", "server", "server-key", "client", "client-key",
                                                          "ca-key")))
    pki.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    assert pki.ca_key is not None
    _write_key(ca_key, pki.ca_key)
    for cert_path, key_path, server in ((pki.server_cert, pki.server_key, True),
                                        (pki.client_cert, pki.client_key, False)):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue("localhost" if server else client_name, key, ca_cert.subject, ca_key, server=server,
                      peer=peer)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_path)
    return pki


def client_certificate(pki: Pki, directory: Path, name: str) -> tuple[Path, Path]:
    """Another client certificate (and its key) signed by ``pki``'s CA, with common name ``name``."""
    assert pki.ca_key is not None
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_cert = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}-key.pem"
    cert_path.write_bytes(_issue(name, key, ca_cert.subject, ca_key).public_bytes(serialization.Encoding.PEM))
    _write_key(key, key_path)
    return cert_path, key_path
