"""Configuration of one replica of a Raft group, and its validation.

A group is named peers (``n1``, ``n2``, ...) each with a Raft address. The TOML
form, shared with the broker's config file::

    [node]
    name = "n1"
    data_dir = "data/n1"

    [group]
    name = "g1"
    peers = { n1 = "127.0.0.1:20001", n2 = "127.0.0.1:20002", n3 = "127.0.0.1:20003" }
    secret_file = "cluster.secret"      # or: secret = "..." (keep it out of git)
    # dial = { n2 = "127.0.0.1:30002" } # reach a peer (or a member added later) through a proxy
    # join = true                       # a replica being added: `peers` lists the current
                                        # members and this node; it catches up as a learner
                                        # until `raftmq replica add` makes it a member

After the first start the member set comes from the log (``dledger.membership``):
``peers`` is only the initial set, and changes are made with ``raftmq replica``.

    [raft]
    flush = "sync"                      # or "async" with flush_interval_ms
    segment_bytes = 1073741824
    retention_hours = 72
    disk_resume_free_bytes = 67108864   # after a full disk, writes resume at this much free
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from common.toml_config import ConfigError, read_section, read_toml

__all__ = ["ConfigError", "FlushPolicy", "GroupConfig", "load_group_config", "read_section", "read_toml"]

#: pysyncobj sends entries >= appendEntriesBatchSizeBytes through a broken
#: chunking path (defect 3); every entry stays below MAX_ENTRY_BYTES and the
#: batch size is kept well above it, so that path is never taken.
APPEND_BATCH_BYTES = 1024 * 1024
MAX_ENTRY_BYTES = 60 * 1024


class FlushPolicy(enum.StrEnum):
    SYNC = "sync"
    ASYNC = "async"


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Everything a replica needs; ``validate()`` runs on construction."""

    node: str
    peers: dict[str, str]
    data_dir: Path
    group: str = "g1"
    secret: str | None = None
    insecure: bool = False
    dial: dict[str, str] = field(default_factory=dict)
    flush: FlushPolicy = FlushPolicy.SYNC
    flush_interval_ms: int = 10
    segment_bytes: int = 1 << 30
    retention_hours: float = 72.0
    retention_bytes: int | None = None
    retention_check_s: float = 60.0
    heartbeat_ms: int = 5
    #: measured (docs/CHAOS.md, issue 35): 300-800 ms fails over in <= 1 s at the median
    #: for every leader fault with no term rise but the faults' under load; 400-1200 did not
    election_timeout_ms: tuple[int, int] = (300, 800)
    #: a leader that heard from no majority this long steps down and answers NOT_LEADER:
    #: one minimum election timeout (docs/DURABILITY.md: chosen with election_timeout_ms;
    #: no read or acknowledgement depends on it)
    leader_lease_ms: int = 300
    connect_retry_ms: int = 300
    #: a node whose disk filled up writes again once this many bytes are free (hysteresis;
    #: at most a tenth of the file system counts: dledger.storage.disk_guard)
    disk_resume_free_bytes: int = 64 << 20
    repair_log: bool = False
    join: bool = False  # a new replica: it catches up as a learner until a member adds it

    def __post_init__(self) -> None:
        self.validate()

    @property
    def address(self) -> str:
        return self.peers[self.node]

    @property
    def other_peers(self) -> dict[str, str]:
        return {name: addr for name, addr in self.peers.items() if name != self.node}

    def require_secret(self) -> None:
        """Refuse to open a Raft port without the cluster secret, whatever the group's size
        and address: pysyncobj without a password unpickles whatever reaches the port (remote
        code execution) and feeds a ``readonly`` connection the whole log. Only ``insecure``
        (``--insecure``, a throw-away test) waives it; the Raft node warns then."""
        if not self.secret and not self.insecure:
            raise ConfigError(
                f"group {self.group} has no cluster secret: every replica's Raft port needs one, "
                "a single-node group's too (without it pysyncobj runs code sent to "
                f"{self.address}); set group.secret_file (a file of at least 32 random characters, "
                "mode 0600, the same on every node) or group.secret, or pass --insecure only for "
                "a throw-away local test")

    def validate(self) -> None:
        if not self.peers:
            raise ConfigError("group.peers is empty: list every replica as name = \"host:port\"")
        if self.node not in self.peers:
            raise ConfigError(
                f"node {self.node!r} is not in group.peers ({', '.join(sorted(self.peers))}): "
                "add it with its Raft address")
        seen: dict[str, str] = {}
        for name, addr in self.peers.items():
            _check_address(f"group.peers.{name}", addr)
            if addr in seen:
                raise ConfigError(
                    f"peers {seen[addr]!r} and {name!r} have the same address {addr}: "
                    "each replica needs its own host:port")
            seen[addr] = name
        for name, addr in self.dial.items():  # a name not in peers: a member that joins later
            _check_address(f"group.dial.{name}", addr)
        if len(self.peers) > 1 and not self.secret and not self.insecure:
            raise ConfigError(
                "a multi-node group needs a cluster secret (group.secret or group.secret_file, "
                "the same on every node) so peers authenticate and encrypt; "
                "pass --insecure only for a throw-away local test")
        lo, hi = self.election_timeout_ms
        if not 3 * self.heartbeat_ms < lo < hi:
            raise ConfigError("raft.election_timeout_ms must be (lo, hi) with 3*heartbeat < lo < hi")
        if self.leader_lease_ms <= self.heartbeat_ms:
            raise ConfigError("raft.leader_lease_ms must exceed raft.heartbeat_ms")
        if self.disk_resume_free_bytes < 0:
            raise ConfigError("raft.disk_resume_free_bytes must be >= 0")
        if self.segment_bytes < 4 * MAX_ENTRY_BYTES:
            raise ConfigError(f"raft.segment_bytes must be at least {4 * MAX_ENTRY_BYTES}")


def _check_address(where: str, addr: str) -> None:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{where} = {addr!r} is not host:port")


class _NodeSection(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    data_dir: str | None = None


class _GroupSection(msgspec.Struct, forbid_unknown_fields=True):
    name: str = "g1"
    peers: dict[str, str] = msgspec.field(default_factory=dict)
    dial: dict[str, str] = msgspec.field(default_factory=dict)
    secret: str | None = None
    secret_file: str | None = None
    insecure: bool = False
    join: bool = False


_Unset = msgspec.UnsetType


class _RaftSection(msgspec.Struct, forbid_unknown_fields=True):
    flush: str | _Unset = msgspec.UNSET
    flush_interval_ms: int | _Unset = msgspec.UNSET
    segment_bytes: int | _Unset = msgspec.UNSET
    retention_hours: float | _Unset = msgspec.UNSET
    retention_bytes: int | _Unset = msgspec.UNSET
    retention_check_s: float | _Unset = msgspec.UNSET
    heartbeat_ms: int | _Unset = msgspec.UNSET
    election_timeout_ms: tuple[int, int] | _Unset = msgspec.UNSET
    leader_lease_ms: int | _Unset = msgspec.UNSET
    connect_retry_ms: int | _Unset = msgspec.UNSET
    disk_resume_free_bytes: int | _Unset = msgspec.UNSET


def load_group_config(path: Path, *, insecure: bool = False, repair_log: bool = False,
                      overrides: dict[str, Any] | None = None,
                      other_sections: Iterable[str] = ()) -> GroupConfig:
    """Read a node's TOML file (module docstring); paths are relative to the file.
    ``other_sections``: top-level tables another layer reads (the broker's [broker])."""
    doc = read_toml(path, ("node", "group", "raft", *other_sections))
    if "name" not in doc.get("node", {}):
        raise ConfigError(f"{path}: [node] name is missing")
    node = read_section(path, doc, "node", _NodeSection)
    group = read_section(path, doc, "group", _GroupSection)
    raft = read_section(path, doc, "raft", _RaftSection)
    base = path.parent
    secret = group.secret
    if group.secret_file:
        secret_path = base / group.secret_file
        try:
            secret = secret_path.read_text().strip()
        except OSError as e:
            raise ConfigError(f"group.secret_file {secret_path}: {e.strerror}") from None
    kwargs: dict[str, Any] = {
        "node": node.name,
        "data_dir": base / (node.data_dir or f"data/{node.name}"),
        "group": group.name,
        "peers": dict(group.peers),
        "dial": dict(group.dial),
        "secret": secret,
        "insecure": insecure or group.insecure,
        "repair_log": repair_log,
        "join": group.join,
    }
    kwargs.update({key: getattr(raft, key) for key in raft.__struct_fields__
                   if getattr(raft, key) is not msgspec.UNSET})
    if "flush" in kwargs:
        try:
            kwargs["flush"] = FlushPolicy(kwargs["flush"])
        except ValueError:
            raise ConfigError(f"{path}: raft.flush = {raft.flush!r}: use \"sync\" or \"async\"") from None
    kwargs.update(overrides or {})
    config = GroupConfig(**kwargs)
    config.require_secret()
    return config
