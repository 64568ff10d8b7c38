"""What a broker replica serves its clients with: its ``[broker]`` section checked for
exposure (``broker.security.exposure``: off loopback, TLS and ACLs or ``--insecure``) and the TLS of
its client port (``broker.security.tls``)."""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

from broker.config import BrokerSection, read_broker_section
from broker.security.exposure import check_exposure
from broker.security.tls import peer_tls, server_context
from protocol.tls import ClientTls

__all__ = ["ServingTls", "read_serving"]

log = logging.getLogger("broker.node")


@dataclass(frozen=True, slots=True)
class ServingTls:
    context: ssl.SSLContext  # the client port's
    peer: ClientTls  # how this replica dials its peers and name servers


def read_serving(path: Path, *, insecure: bool) -> tuple[BrokerSection, ServingTls | None]:
    """The ``[broker]`` section of ``path`` and its TLS (None: plain); ConfigError when a TLS
    file cannot be used or the listen address is exposed without TLS and ACLs and not
    ``insecure`` (a WARNING when it is)."""
    section = read_broker_section(path)
    tls = None
    if section.tls is not None:
        tls = ServingTls(server_context(section.tls, "broker.tls"), peer_tls(section.tls))
    check_exposure("the broker", section.listen, tls=tls is not None, acl=section.acl,
                   insecure=insecure, how="[broker.tls] and [broker] acl = true (docs/SECURITY.md)", log=log)
    return section, tls
