"""A development CA, a server certificate and a password per NATS identity, made on first start
under a directory of their own (`crater up`: <data dir>/nats-security) and kept: what a secured
nats-server and the services connecting to it as themselves need on one machine.

Not for production: there, certificates come from your own CA and passwords (or credentials)
from your secret store; the server configuration is still `render_server_config`'s.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from crater.runtime.nats_permissions import IDENTITIES, node_identity, render_server_config

VALID_DAYS = 825


@dataclass(frozen=True)
class DevSecurity:
    directory: Path
    ca_cert: Path
    server_cert: Path
    server_key: Path
    config: Path  # the nats-server configuration: users, permissions, TLS

    def password_file(self, identity: str) -> Path:
        return self.directory / "users" / f"{identity}.password"

    def password(self, identity: str) -> str:
        return self.password_file(identity).read_text().strip()

    def env(self, identity: str) -> dict[str, str]:
        """The CRATER_* variables a process connecting as `identity` needs."""
        return {
            "CRATER_NATS_USER": identity,
            "CRATER_NATS_PASSWORD_FILE": str(self.password_file(identity)),
            "CRATER_NATS_TLS_CA": str(self.ca_cert),
        }


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Crater development"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _make_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    name = _name("Crater development CA")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(directory / "ca.key", _key_pem(key))
    (directory / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def _make_server_cert(
    directory: Path,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    hosts: Iterable[str],
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("nats-server"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_private(directory / "server.key", _key_pem(key))
    (directory / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def prepare(
    directory: Path,
    hosts: Iterable[str] = ("127.0.0.1", "localhost"),
    nodes: Iterable[str] = (),
) -> DevSecurity:
    """The CA, server certificate and passwords in `directory` (one per identity, and one per
    node of `nodes`: users/node-<id>.password), made if missing (kept otherwise); the server
    configuration rewritten from the catalog and `nodes` on every call."""
    nodes = tuple(nodes)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    security = DevSecurity(
        directory=directory,
        ca_cert=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        config=directory / "nats.conf",
    )
    if not (directory / "ca.key").exists() or not security.ca_cert.exists():
        ca_cert, ca_key = _make_ca(directory)
        _make_server_cert(directory, ca_cert, ca_key, hosts)
    elif not security.server_cert.exists() or not security.server_key.exists():
        ca_cert = x509.load_pem_x509_certificate(security.ca_cert.read_bytes())
        loaded = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
        assert isinstance(loaded, ec.EllipticCurvePrivateKey)
        _make_server_cert(directory, ca_cert, loaded, hosts)
    passwords: dict[str, str] = {}
    for identity in (*IDENTITIES, *(node_identity(n) for n in nodes)):
        path = security.password_file(identity)
        if not path.exists():
            _write_private(path, secrets.token_urlsafe(24).encode())
        passwords[identity] = security.password(identity)
    config = render_server_config(
        passwords, nodes=nodes, tls_cert=str(security.server_cert), tls_key=str(security.server_key)
    )
    _write_private(security.config, config.encode())
    return security
