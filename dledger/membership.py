"""A group's member set, changed one server at a time through the log.

A membership change is a Raft entry (Raft thesis §4.1, one server at a time): it
takes effect on every replica as soon as the replica *appends* it -- committed or
not -- and is undone if a conflicting leader truncates it. The member set a
replica uses is therefore the one of the newest change entry in its log, or the
group's initial set (the TOML ``peers``) before any change.

The entry is pysyncobj's MEMBERSHIP command, with a member id string instead of
a pickled node object, so that the log holds plain data::

    command = b"\\x02" + pickle(["add" | "rem", "<name> <raft host:port> <client host:port>[ <storage>]"])

(``client`` is the broker's listen address, ``-`` when unknown; ``storage`` the token of
the storage identity recorded for the member, ``dledger.raft.storage_identity``, absent while
none is.) pysyncobj turns the id into a node through the ``nodeClass`` factory
``ReplicatedLog`` hands it; its identity is the Raft address alone.

Recording a member's storage identity (issue 24) is its own entry, which pysyncobj's
membership path would refuse (it knows no such change): a regular command of the node's
second replicated method, whose apply does nothing (``RaftNode._bind_storage``)::

    command = b"\\x00" + pickle((BIND_FUNC_ID, (msgpack([[name, storage token], ...]),)))

``decode_change`` reads both kinds; a bind entry sets the storage of the named members.

``MemberHistory`` records, durably, the member set after each change entry a
replica holds (file ``members``, msgpack ``[[index, [member id, ...]], ...]``),
so a restarted replica starts with the member set of its own log -- pysyncobj
keeps it in memory only -- and a truncation or a log restart rolls it back.
Records below the retained start are dropped except the newest of them.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

import msgpack

from common.durable_file import atomic_write, read_or_none

__all__ = ["BIND_FUNC_ID", "MEMBERSHIP_PREFIX", "Change", "Member", "MemberHistory", "apply_change",
           "decode_change", "decode_changes", "encode_bindings", "encode_change"]

MEMBERSHIP_PREFIX = b"\x02"  # pysyncobj's _COMMAND_TYPE.MEMBERSHIP
_REGULAR_PREFIX = b"\x00"  # pysyncobj's _COMMAND_TYPE.REGULAR
#: pysyncobj's id of ``RaftNode._bind_storage`` (methods are numbered by name: ``_append`` is 0)
BIND_FUNC_ID = 1
_OPS = {"add", "rem"}


@dataclass(frozen=True, slots=True)
class Member:
    """One replica: its name, Raft address (pysyncobj's identity), broker address and the
    token of the storage identity recorded for it ("" while none is)."""

    name: str
    raft: str
    client: str = ""
    storage: str = ""

    @property
    def member_id(self) -> str:
        base = f"{self.name} {self.raft} {self.client or '-'}"
        return f"{base} {self.storage}" if self.storage else base

    @classmethod
    def parse(cls, member_id: str) -> Member:
        parts = member_id.split(" ")
        if len(parts) not in (3, 4) or not all(parts):
            raise ValueError(f"not a member id: {member_id!r}")
        name, raft, client = parts[:3]
        return cls(name, raft, "" if client == "-" else client, parts[3] if len(parts) == 4 else "")

    def check(self) -> None:
        """Raise ValueError unless the name and addresses are usable."""
        if not self.name or any(c.isspace() for c in self.name) or len(self.name) > 64:
            raise ValueError(f"member name {self.name!r}: 1..64 characters, no spaces")
        for what, addr in (("raft", self.raft), ("client", self.client)):
            if what == "client" and not addr:
                continue
            host, sep, port = addr.rpartition(":")
            if not sep or not host or any(c.isspace() for c in addr) or not port.isdigit() \
                    or not 0 < int(port) < 65536:
                raise ValueError(f"member {self.name}: {what} address {addr!r} is not host:port")


@dataclass(frozen=True, slots=True)
class Change:
    op: str  # "add", "rem" or "bind" (the member's storage: ``member.storage``)
    member: Member


def encode_change(change: Change) -> bytes:
    """The command bytes (without pysyncobj's type byte) of a membership change."""
    if change.op not in _OPS:
        raise ValueError(f"membership change op {change.op!r}")
    return pickle.dumps([change.op, change.member.member_id], protocol=5)


def encode_bindings(bindings: dict[str, str]) -> bytes:
    """The payload of a bind entry: member name -> storage token."""
    return msgpack.packb(sorted([name, token] for name, token in bindings.items()))


def decode_bindings(command: bytes) -> list[Change] | None:
    """The bind changes of a full regular command, or None if it is not a bind entry."""
    if command[:1] != _REGULAR_PREFIX:
        return None
    try:
        func, args = pickle.loads(command[1:])
        if func != BIND_FUNC_ID or len(args) != 1:
            return None
        return [Change("bind", Member(str(name), "-", "", str(token)))
                for name, token in msgpack.unpackb(args[0])]
    except Exception:  # another regular command: not a bind entry
        return None


def decode_changes(command: bytes) -> list[Change]:
    """Every change a RAFT-kind entry makes (a membership change, or a bind entry's)."""
    change = decode_change(command)
    if change is not None:
        return [change]
    return decode_bindings(command) or []


def decode_change(command: bytes) -> Change | None:
    """The change in a full command (type byte included), or None if it is not one of ours."""
    if command[:1] != MEMBERSHIP_PREFIX:
        return None
    try:
        request = pickle.loads(command[1:])
        op, member_id = request[0], request[1]
        if op not in _OPS or not isinstance(member_id, str):
            return None
        return Change(op, Member.parse(member_id))
    except Exception:  # a change written by another tool: not ours to interpret
        return None


def apply_change(members: dict[str, Member], change: Change) -> dict[str, Member]:
    """The member set after ``change`` (a new dict; by name)."""
    out = dict(members)
    if change.op == "add":
        out[change.member.name] = change.member
    elif change.op == "bind":
        current = out.get(change.member.name)
        if current is not None:
            out[change.member.name] = Member(current.name, current.raft, current.client,
                                             change.member.storage)
    else:
        out.pop(change.member.name, None)
    return out


class MemberHistory:
    """The member set after each change entry held (module docstring). Not thread-safe:
    the tick thread writes it; readers take ``current()`` (an immutable snapshot)."""

    def __init__(self, path: Path, initial: dict[str, Member], last_index: int) -> None:
        self._path = path
        raw = read_or_none(path)
        self._records: list[tuple[int, dict[str, Member]]] = []
        if raw:
            for index, ids in msgpack.unpackb(raw):
                members = [Member.parse(i) for i in ids]
                self._records.append((int(index), {m.name: m for m in members}))
        if not self._records:
            self._records = [(0, dict(initial))]
            self._save()
        elif self._records[-1][0] > last_index:  # entries lost in a crash before their fsync
            self.truncate_from(last_index + 1)
        self._current = self._records[-1][1]

    def current(self) -> dict[str, Member]:
        return self._current

    def at(self, index: int) -> dict[str, Member]:
        """The member set after entry ``index``."""
        found = self._records[0][1]
        for at, members in self._records:
            if at > index:
                break
            found = members
        return found

    def changed_at(self) -> int:
        """The index of the newest change entry held (0: the initial set)."""
        return self._records[-1][0]

    def storage_recorded_at(self, name: str) -> int:
        """The index of the entry that recorded ``name``'s current storage (0: the initial
        set, or the oldest record kept). -1 when ``name`` is not a member."""
        current = self._current.get(name)
        if current is None:
            return -1
        at = 0
        for index, members in reversed(self._records):
            member = members.get(name)
            if member is None or member.storage != current.storage:
                break
            at = index
        return at

    def record(self, index: int, change: Change | list[Change]) -> None:
        """Change entry ``index`` was appended (a bind entry may make several changes)."""
        self.truncate_from(index)
        members = self._records[-1][1]
        for one in change if isinstance(change, list) else [change]:
            members = apply_change(members, one)
        self._records.append((index, members))
        self._current = self._records[-1][1]
        self._save()

    def truncate_from(self, index: int) -> None:
        """Entries from ``index`` on were removed from the log."""
        kept = [r for r in self._records if r[0] < index] or self._records[:1]
        if len(kept) != len(self._records):
            self._records = kept
            self._current = kept[-1][1]
            self._save()

    def restart_at(self, index: int, members: dict[str, Member] | None) -> None:
        """The log restarted after ``index`` with the leader's member set there."""
        if members is None:
            members = self.at(index)
        self._records = [(index, dict(members))]
        self._current = self._records[-1][1]
        self._save()

    def forget_below(self, first_index: int) -> None:
        """Retention deleted the entries before ``first_index``."""
        older = [r for r in self._records if r[0] < first_index]
        if len(older) > 1:
            self._records = older[-1:] + [r for r in self._records if r[0] >= first_index]
            self._save()

    def _save(self) -> None:
        atomic_write(self._path, msgpack.packb(
            [[index, [m.member_id for m in members.values()]] for index, members in self._records]))
