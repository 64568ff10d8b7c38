"""TLS of a broker's client port and of a name server: the ``tls`` table of their TOML and
the contexts built from it.

    [broker.tls]                      # or [namesrv.tls]; no table: plain HTTP
    cert_file = "/etc/raftmq/tls/broker1.pem"   # this host's certificate chain (PEM)
    key_file = "/etc/raftmq/tls/broker1.key"    # its private key (PEM, mode 0600)
    ca_file = "/etc/raftmq/tls/ca.pem"          # the cluster's CA: verifies peers and name
                                                # servers this process calls, and client
                                                # certificates under client_auth
    # client_auth = false             # true: mutual TLS -- every client presents a
                                      # certificate signed by ca_file

Relative paths are relative to the TOML file. TLS 1.2 is the lowest version spoken. A
broker with TLS calls its peers (digests, catch-up checks) and its name servers over
``https`` too, verified against ``ca_file`` and presenting its own certificate (which
must then allow client authentication as well as server authentication: the local CA's
certificates do). One cluster, one CA: TLS is on for every port of it or for none.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import msgspec

from common.toml_config import ConfigError
from protocol.tls import ClientTls, listening_context

__all__ = ["TlsSection", "peer_tls", "server_context"]


class TlsSection(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    cert_file: str
    key_file: str
    ca_file: str = ""
    client_auth: bool = False

    def relative_to(self, base: Path) -> TlsSection:
        """The same table with its paths made relative to ``base`` (the TOML's directory)."""
        def at(p: str) -> str:
            return str(base / p) if p else ""
        return TlsSection(at(self.cert_file), at(self.key_file), at(self.ca_file), self.client_auth)


def server_context(tls: TlsSection, where: str) -> ssl.SSLContext:
    """The listening side's context; ConfigError (naming ``where``, e.g. ``broker.tls``)
    when a file cannot be read or does not fit."""
    if tls.client_auth and not tls.ca_file:
        raise ConfigError(f"{where}.client_auth = true needs {where}.ca_file: the CA that signs the "
                          "clients' certificates")
    try:
        ctx = listening_context(tls.cert_file, tls.key_file)  # trusts no CA but ca_file, below
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"{where}: cannot use cert_file {tls.cert_file} with key_file {tls.key_file}: "
                          f"{e}") from None
    if tls.ca_file:
        try:
            ctx.load_verify_locations(cafile=tls.ca_file)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"{where}.ca_file {tls.ca_file}: {e}") from None
    ctx.verify_mode = ssl.CERT_REQUIRED if tls.client_auth else ssl.CERT_NONE
    return ctx


def peer_tls(tls: TlsSection) -> ClientTls:
    """How this process dials its peers and name servers: verified against ``ca_file``,
    presenting its own certificate (mutual TLS there needs it)."""
    return ClientTls(tls.ca_file or None, tls.cert_file, tls.key_file)
