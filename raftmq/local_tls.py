"""A local cluster's certificate authority (``raftmq cluster up --tls``, ``scripts/run --tls``,
``LocalGroup(tls=True)``), made with ``cryptography``::

    DIR/ca.pem        the CA's certificate: what clients are given (``--ca-file``)
    DIR/ca.key        the CA's private key (mode 0600; signs the certificates below)
    DIR/server.pem    one certificate for every local process (brokers, name server):
    DIR/server.key      subjectAltName 127.0.0.1, ::1, localhost; server and client
                        authentication (a broker presents it to its peers under mutual TLS)
    DIR/client.pem    a client certificate (CN raftmq-client) for mutual TLS
    DIR/client.key

Keys are ECDSA P-256, certificates SHA-256, valid for 825 days; files made once and reused.
Everything here is generated on the machine and never committed (``run/`` and the test
directories are outside git).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from broker.security.tls import TlsSection
from protocol.tls import ClientTls

__all__ = ["LocalCA"]

VALID_DAYS = 825
LOCAL_NAMES = ("127.0.0.1", "::1", "localhost")


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    path.chmod(0o600)


def _alt_names(names: tuple[str, ...]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for name in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


@dataclass(frozen=True, slots=True)
class LocalCA:
    """The CA files under ``dir`` (module docstring); ``ensure()`` makes what is missing."""

    dir: Path

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca.pem"

    def ensure(self) -> LocalCA:
        """Make the directory, the CA and the server and client certificates, once."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if not (self.dir / "ca.key").exists() or not self.ca_file.exists():
            key = ec.generate_private_key(ec.SECP256R1())
            # a name of its own: another local CA's certificates are not even candidates
            cn = f"RaftMQ local CA {os.urandom(4).hex()}"
            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
            cert = (self._builder(name, name, key.public_key())
                    .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                    .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                                   critical=True)
                    .sign(key, hashes.SHA256()))
            _write_key(self.dir / "ca.key", key)
            self.ca_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        if not (self.dir / "server.pem").exists():
            self.issue("server", "raftmq-local", LOCAL_NAMES)
        if not (self.dir / "client.pem").exists():
            self.issue("client", "raftmq-client", ())
        return self

    def issue(self, stem: str, common_name: str, names: tuple[str, ...]) -> tuple[Path, Path]:
        """``DIR/stem.pem`` and ``stem.key``: a certificate for ``names`` (subjectAltName)
        signed by the CA, good for server and client authentication."""
        ca_key = serialization.load_pem_private_key((self.dir / "ca.key").read_bytes(), None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        ca_cert = x509.load_pem_x509_certificate(self.ca_file.read_bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        builder = (self._builder(subject, ca_cert.subject, key.public_key())
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                         ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(_alt_names(names)), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        cert_path, key_path = self.dir / f"{stem}.pem", self.dir / f"{stem}.key"
        _write_key(key_path, key)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cert_path, key_path

    @staticmethod
    def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
                 ) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.UTC)
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=VALID_DAYS)))

    def server_tls(self, client_auth: bool = False) -> TlsSection:
        """The ``[broker.tls]`` / ``[namesrv.tls]`` table of a local process (absolute paths)."""
        return TlsSection(str(self.dir / "server.pem"), str(self.dir / "server.key"), str(self.ca_file),
                          client_auth)

    def client_tls(self, with_cert: bool = False) -> ClientTls:
        """What a client of the local cluster is given; ``with_cert``: the client certificate
        too (mutual TLS)."""
        if not with_cert:
            return ClientTls(str(self.ca_file))
        return ClientTls(str(self.ca_file), str(self.dir / "client.pem"), str(self.dir / "client.key"))
