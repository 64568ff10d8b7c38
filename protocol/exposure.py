"""Secure by default off loopback: a process serving clients on an address other hosts can
reach starts only with its protections on, or with an explicit ``--insecure``.

    listen address                 broker needs        name server needs        console needs
    127.0.0.0/8, ::1, localhost    nothing             nothing                  nothing
    anything else (0.0.0.0, ::,    TLS and ACLs        TLS (its registrations   TLS (a password
    a host's address or name)      ([broker.tls],      are signed already: it   typed at sign-in)
                                   [broker] acl)       refuses to start without (--listen-cert-file,
                                                       groups' keys)            --listen-key-file)

Without them the process refuses to start (``ExposureRefused``: an ``error:`` line naming
what is missing and how to add it, exit 2); ``--insecure`` lets it start and logs a WARNING
saying so at every start. A host name counts as loopback only when every address it
resolves to is one. Shared by the broker (``broker.security.exposure``: a refusal is a
``ConfigError``) and the console, hence here, with no import of ours.
"""

from __future__ import annotations

import ipaddress
import logging
import socket

__all__ = ["ExposureRefused", "check_exposure", "is_loopback", "missing_protections"]


class ExposureRefused(ValueError):
    """A process would listen where other hosts reach it without its protections."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name; "" and wildcards are every interface) is
    reachable from this host only."""
    host = host.strip().strip("[]")
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback  # 0.0.0.0 and :: are not
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback
                               for info in infos)


def missing_protections(listen: str, *, tls: bool, acl: bool | None) -> list[str]:
    """What a process listening on ``listen`` (HOST:PORT) lacks to be reachable from other
    hosts: "TLS", "ACLs" (``acl`` None: not asked of this kind of process); [] on loopback."""
    host = listen.rpartition(":")[0]
    if is_loopback(host):
        return []
    return [name for name, on in (("TLS", tls), ("ACLs", acl)) if on is False]


def check_exposure(what: str, listen: str, *, tls: bool, acl: bool | None, insecure: bool,
                   how: str, log: logging.Logger) -> None:
    """Refuse (``ExposureRefused``) a ``what`` listening off loopback without its protections, unless
    ``insecure``: then log a WARNING. ``how`` says where the protections are configured."""
    missing = missing_protections(listen, tls=tls, acl=acl)
    if not missing:
        return
    lacking = " and ".join(missing)
    if not insecure:
        raise ExposureRefused(f"{what} listens on {listen}, which other hosts can reach, without {lacking}: "
                              f"configure {how}, listen on 127.0.0.1, or pass --insecure to serve "
                              "anyone who reaches it anyway")
    log.warning("INSECURE (--insecure): %s listens on %s without %s: anyone who reaches it is "
                "trusted (configure %s)", what, listen, lacking, how)
