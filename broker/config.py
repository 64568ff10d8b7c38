"""The ``[broker]`` section of a replica's TOML file (the other sections: ``dledger.config``)::

    [broker]
    listen = "10.0.0.11:10911"          # clients' WebSocket (wss://.../ws) and HTTPS admin/metrics
    addresses = { n1 = "10.0.0.11:10911", n2 = "10.0.0.12:10911", n3 = "10.0.0.13:10911" }
    namesrv = ["10.0.0.21:9876"]        # name servers to register with (optional)
    # max_message_bytes = 4194304       # largest encoded message accepted (1 .. 64 MiB)
    # delay_levels = "1s 5s 10s 30s 1m ..."   # RocketMQ's 18 levels by default
    # retry_delays = "10s 30s 1m ..."         # the 16-step retry schedule by default
    # retry_overdue_s = 15              # a retried message this late past due is reported
    # digest_every = 4096               # entries between the state digests replicas compare
    # index_slots, index_entries        # IndexFile geometry (the full-size files)
    # cq_units_per_file = 300000        # ConsumeQueue file size in 40-byte units (one per record)
    # acl = false                       # users, SCRAM authentication and policies on every
                                        # request (docs/SECURITY.md); default off
    # acl_bootstrap_file = "admin.scram"  # a super user's record (`raftmq user hash`), added by
                                        # the leader while no user has its name
    # acl_token_ttl_s = 600             # how long an admin HTTP token is valid (1 .. 86400)
    # max_connections = 4096, max_connections_per_address = 256, fd_reserve = 256,
    # idle_timeout_s = 120, frame_deadline_s = 30, max_partial_frame_bytes, max_inflight_bytes,
    # max_parked_pulls_per_connection = 1024, max_parked_pulls = 16384
    #                                   # the client port's bounds (broker.remoting.client_limits)

    [broker.tls]                        # TLS on the client port (wss://, https://): broker.security.tls
    cert_file = "tls/broker1.pem"
    key_file = "tls/broker1.key"
    ca_file = "tls/ca.pem"
    # client_auth = false               # true: mutual TLS

Unknown keys and wrong types are refused naming the file and the key (``msgspec``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import msgspec

from broker.remoting.client_limits import ClientLimits
from broker.security.access_control import read_bootstrap
from broker.security.tls import TlsSection
from broker.state.held import parse_delay_levels
from broker.state.machine import DIGEST_EVERY
from broker.store.index_file import DEFAULT_INDEX_NUM, DEFAULT_SLOT_NUM
from common.toml_config import ConfigError, read_section, read_toml
from protocol.message_format import MAX_MESSAGE_BYTES

__all__ = ["MAX_MESSAGE_BYTES_LIMIT", "SECTIONS", "BrokerSection", "read_broker_section"]

#: Upper bound of ``[broker] max_message_bytes``: a request frame and a message being
#: reassembled from its fragments are held in memory whole.
MAX_MESSAGE_BYTES_LIMIT = 64 * 1024 * 1024
#: the top-level tables of a broker replica's file
SECTIONS = ("node", "group", "raft", "broker")


class BrokerSection(msgspec.Struct, forbid_unknown_fields=True):
    listen: str
    addresses: dict[str, str] = msgspec.field(default_factory=dict)
    namesrv: list[str] = msgspec.field(default_factory=list)
    max_message_bytes: int = MAX_MESSAGE_BYTES
    delay_levels: str | msgspec.UnsetType = msgspec.UNSET
    retry_delays: str | msgspec.UnsetType = msgspec.UNSET
    retry_overdue_s: float | msgspec.UnsetType = msgspec.UNSET
    digest_every: int = DIGEST_EVERY
    index_slots: int = DEFAULT_SLOT_NUM
    index_entries: int = DEFAULT_INDEX_NUM
    cq_units_per_file: int = 300_000
    #: Whether every request is authenticated and authorized (``broker.security.access_control``);
    #: what a check of a secure start looks at (``broker.security.exposure``).
    acl: bool = False
    acl_bootstrap_file: str | None = None
    acl_token_ttl_s: float = 600.0
    tls: TlsSection | None = None
    #: web pages (``https://host:port``) that may open /ws and POST to the admin API, besides
    #: the port's own origin (``common.http_errors.browser_guard``)
    allowed_origins: list[str] = msgspec.field(default_factory=list)
    max_connections: int | msgspec.UnsetType = msgspec.UNSET
    max_connections_per_address: int | msgspec.UnsetType = msgspec.UNSET
    fd_reserve: int | msgspec.UnsetType = msgspec.UNSET
    idle_timeout_s: float | msgspec.UnsetType = msgspec.UNSET
    frame_deadline_s: float | msgspec.UnsetType = msgspec.UNSET
    max_partial_frame_bytes: int | msgspec.UnsetType = msgspec.UNSET
    max_inflight_bytes: int | msgspec.UnsetType = msgspec.UNSET
    max_parked_pulls_per_connection: int | msgspec.UnsetType = msgspec.UNSET
    max_parked_pulls: int | msgspec.UnsetType = msgspec.UNSET

    def server_options(self) -> dict[str, Any]:
        """The BrokerServer keyword arguments this section sets (the rest keep its defaults)."""
        options: dict[str, Any] = {"max_message_bytes": self.max_message_bytes}
        if self.acl:
            options["acl"] = True
        if self.acl_token_ttl_s != 600.0:
            options["acl_token_ttl_s"] = self.acl_token_ttl_s
        if self.acl_bootstrap_file is not None:
            options["acl_bootstrap"] = read_bootstrap(Path(self.acl_bootstrap_file))
        for key in ("delay_levels", "retry_delays", "retry_overdue_s"):
            if getattr(self, key) is not msgspec.UNSET:
                options[key] = getattr(self, key)
        if self.allowed_origins:
            options["allowed_origins"] = tuple(self.allowed_origins)
        limits = self.client_limits()
        if limits != ClientLimits():
            options["limits"] = limits
        return options

    def client_limits(self) -> ClientLimits:
        """The client port's bounds: the keys set here, ClientLimits' defaults for the rest
        (ValueError if they do not fit together)."""
        return ClientLimits(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ClientLimits)
                               if getattr(self, f.name) is not msgspec.UNSET})


def read_broker_section(path: Path) -> BrokerSection:
    """The checked ``[broker]`` section of the file at ``path``; ConfigError says what to fix."""
    doc = read_toml(path, SECTIONS)
    if not doc.get("broker", {}).get("listen"):
        raise ConfigError(f"{path}: [broker] listen = \"host:port\" is missing")
    section = read_section(path, doc, "broker", BrokerSection)
    if not 1 <= section.max_message_bytes <= MAX_MESSAGE_BYTES_LIMIT:
        raise ConfigError(f"{path}: broker.max_message_bytes must be in 1..{MAX_MESSAGE_BYTES_LIMIT}, "
                          f"not {section.max_message_bytes}")
    for key in ("delay_levels", "retry_delays"):
        value = getattr(section, key)
        if value is not msgspec.UNSET:
            try:
                parse_delay_levels(value)
            except ValueError as e:
                raise ConfigError(f"{path}: broker.{key}: {e}") from None
    if not 64 <= section.digest_every <= 10_000_000:
        raise ConfigError(f"{path}: broker.digest_every (entries between state digests the replicas "
                          f"compare) must be in 64..10000000, not {section.digest_every}")
    try:
        section.client_limits()
    except ValueError as e:
        raise ConfigError(f"{path}: broker.{e}") from None
    overdue = section.retry_overdue_s
    if overdue is not msgspec.UNSET and not 1 <= overdue <= 86_400:
        raise ConfigError(f"{path}: broker.retry_overdue_s must be a number of seconds in 1..86400, "
                          f"not {overdue}")
    if section.tls is not None:
        section.tls = section.tls.relative_to(path.parent)
    if not 1 <= section.acl_token_ttl_s <= 86_400:
        raise ConfigError(f"{path}: broker.acl_token_ttl_s must be in 1..86400 s, "
                          f"not {section.acl_token_ttl_s}")
    if section.acl_bootstrap_file is not None:
        bootstrap = path.parent / section.acl_bootstrap_file  # relative to the file
        try:
            read_bootstrap(bootstrap)
        except ValueError as e:
            raise ConfigError(f"{path}: broker.acl_bootstrap_file: {e}") from None
        section = msgspec.structs.replace(section, acl_bootstrap_file=str(bootstrap))
    return section
