"""TLS on the client-facing ports: what the dialling side needs (clients, and brokers calling
their peers and name servers).

A broker's client port and a name server serve either plain HTTP or TLS, never both; the
dialling side picks the scheme from its own TLS settings, never from an address (routes
and ``NOT_LEADER`` answers carry ``host:port`` only)::

                 plain                        TLS (``ClientTls`` given)
    WebSocket    ws://host:port/ws            wss://host:port/ws
    HTTP         http://host:port/status      https://host:port/status

A ``ClientTls`` verifies the server's certificate against ``ca_file`` (the system's trust
store when None) and its name against the host dialled (an IP address needs an IP entry in
the certificate's subjectAltName); TLS 1.2 is the lowest version spoken. With
``cert_file`` it presents a client certificate, for servers that require mutual TLS.

The environment (``ClientTls.from_env``), for clients given no TLS setting::

    RAFTMQ_CA_FILE=/etc/raftmq/tls/ca.pem      TLS, verified against this CA
    RAFTMQ_TLS=1                               TLS, verified against the system's CAs
    RAFTMQ_CERT_FILE, RAFTMQ_KEY_FILE          a client certificate (mutual TLS)
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["MIN_VERSION", "ClientTls", "http_url", "listening_context", "resolve_tls", "ws_url"]

#: The lowest protocol version either side accepts.
MIN_VERSION = ssl.TLSVersion.TLSv1_2

_TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True, slots=True)
class ClientTls:
    """How to dial a TLS port (module docstring). Paths are PEM files."""

    ca_file: str | None = None  # the CA that signed the servers' certificates; None: the system's
    cert_file: str | None = None  # this side's certificate chain, for mutual TLS
    key_file: str | None = None  # its private key (None: it is in cert_file)

    def context(self) -> ssl.SSLContext:
        """A fresh client context; OSError/ssl.SSLError when a file cannot be read or used."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
        ctx.minimum_version = MIN_VERSION
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientTls | None:
        """TLS as the ``RAFTMQ_*`` variables ask (module docstring); None: plain."""
        env = os.environ if environ is None else environ
        ca, cert, key = (env.get(f"RAFTMQ_{k}_FILE") or None for k in ("CA", "CERT", "KEY"))
        if ca or cert or env.get("RAFTMQ_TLS", "").strip().lower() in _TRUE:
            return cls(ca, cert, key)
        return None


def listening_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A listening side's context (the broker's ports, the console's page): its certificate
    chain, TLS ``MIN_VERSION`` or later, trusting no CA (not the system's: a caller that asks
    clients for certificates loads its own). OSError or ssl.SSLError when the files cannot be
    used."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MIN_VERSION
    ctx.load_cert_chain(cert_file, key_file)
    return ctx


def resolve_tls(tls: ClientTls | bool | None) -> ClientTls | None:
    """A client's ``tls=`` option: a ``ClientTls``; True (the system's CAs); False (plain);
    None (the environment decides: ``ClientTls.from_env``)."""
    if isinstance(tls, ClientTls):
        return tls
    if tls is None:
        return ClientTls.from_env()
    return ClientTls() if tls else None


def http_url(address: str, path: str, tls: bool) -> str:
    """``http(s)://address/path`` (``path`` starts with '/')."""
    return f"{'https' if tls else 'http'}://{address}{path}"


def ws_url(address: str, path: str, tls: bool) -> str:
    """``ws(s)://address/path``."""
    return f"{'wss' if tls else 'ws'}://{address}{path}"
