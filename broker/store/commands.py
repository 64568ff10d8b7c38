"""The records a leader puts in an entry batch, one typed dataclass per kind.

A message record (``protocol.record_batch``: 1..N messages of one queue) starts with
its kind byte ``2`` and is stored as it is, so the ConsumeQueue can point at its bytes.
Every other record is a msgpack array whose first element says what it is: a fragment
carries a slice of a record too large for one entry; every other kind is an admin or
state command::

    kind  record                                                     effect at apply
    ----  ---------------------------------------------------------  ------------------------------
       2  message record (see protocol.record_batch)                 stored in a queue
      20  [20, chain_id, number, total, slice] (see broker.store.fragments) one piece of a message too
                                                                     large for one entry; stored
                                                                     when its chain is complete
     100  [100, topic, queues, perm]                                 create or update a topic
     101  [101, topic]                                               delete a topic
     110  [110, group, topic, queue_id, offset]                      commit a consumer offset
     121  [121, half_position]                                       roll back a transaction half
     122  [122, half_position, at_ms]                                a check-back was sent at at_ms
     130  [130, group, client_id, topic, queue_id, lock]             take (lock true) or give back a
                                                                     queue's consume lock (orderly)
     140  [140, user, super, salt, iterations, stored_key,           create a user or replace its
           server_key]                                               credentials (SCRAM-SHA-256)
     141  [141, user]                                                delete a user and its policies
     142  [142, user, resource, decision, source, [actions]]         grant: add actions to a statement
     143  [143, user, resource, decision, source, [actions]]         revoke them ([]: the statement)
     144  [144, access_key, user, sealed, created_ms]              a RocketMQ access key of a user,
     145  [145, access_key]                                        revoked (broker.store.
                                                                   access_key_commands)
     160..164  a group's retry policy; POP claims, acks, invisibility changes, dead-letter
               settlements (see broker.store.pop_commands)
     150  [150, marker_id, from_position]                            a verify marker: every replica
                                                                     digests its state and its
                                                                     ConsumeQueue units from
                                                                     CommitLog position
                                                                     from_position here
                                                                     (broker.state.marker_digest)

Kinds 1..19 are kept for message format versions (1, a msgpack message of one, is no
longer read: a store of that format is refused at start). A fragment is always the only
record of its entry.

Only the leader creates records (after validating the request); the apply step
re-validates everything, because a record is committed before it is applied and
the state may have changed in between (e.g. the topic was deleted).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import msgpack

from broker.store.access_key_commands import (
    ACCESS_KEY_KINDS,
    ACCESS_KEY_TYPES,
    AccessKeyRecord,
    access_key_row,
    decode_access_key,
)
from broker.store.pop_commands import POP_KINDS, POP_TYPES, PopRecord, decode_pop, pop_row
from protocol.record_batch import RECORD_KIND
from protocol.topic import Perm

__all__ = [
    "CheckHalf",
    "CommitOffset",
    "CreateTopic",
    "DeleteTopic",
    "DeleteUser",
    "Grant",
    "LockQueue",
    "Perm",
    "PutUser",
    "RecordKind",
    "Revoke",
    "RollbackHalf",
    "VerifyMarker",
    "decode_admin",
    "encode_admin",
    "record_kind",
]


class RecordKind(enum.IntEnum):
    MESSAGE = RECORD_KIND
    FRAGMENT = 20
    CREATE_TOPIC = 100
    DELETE_TOPIC = 101
    COMMIT_OFFSET = 110
    ROLLBACK_HALF = 121
    CHECK_HALF = 122
    LOCK_QUEUE = 130
    PUT_USER = 140
    DELETE_USER = 141
    GRANT = 142
    REVOKE = 143
    VERIFY_MARKER = 150


@dataclass(frozen=True, slots=True)
class CreateTopic:
    topic: str
    queues: int = 8
    perm: Perm = Perm.READ_WRITE


@dataclass(frozen=True, slots=True)
class DeleteTopic:
    topic: str


@dataclass(frozen=True, slots=True)
class CommitOffset:
    group: str
    topic: str
    queue_id: int
    offset: int


@dataclass(frozen=True, slots=True)
class RollbackHalf:
    position: int


@dataclass(frozen=True, slots=True)
class CheckHalf:
    position: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class LockQueue:
    """An orderly consumer takes (``lock``) or gives back the lock of one queue for its group."""

    group: str
    client_id: str
    topic: str
    queue_id: int
    lock: bool


@dataclass(frozen=True, slots=True)
class PutUser:
    """A user's SCRAM-SHA-256 credentials (never the password): created, or replaced."""

    user: str
    super: bool
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


@dataclass(frozen=True, slots=True)
class DeleteUser:
    user: str


@dataclass(frozen=True, slots=True)
class Grant:
    """Add ``actions`` to the statement (user, resource, decision, source); the resource
    and source in the canonical text of ``protocol.acl``."""

    user: str
    resource: str
    decision: str
    source: str
    actions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Revoke(Grant):
    """Take ``actions`` from the statement; none: the whole statement."""


@dataclass(frozen=True, slots=True)
class VerifyMarker:
    """``raftmq cluster verify`` (``broker.http_api.verify``): where every replica digests its
    derived state and reads back its ConsumeQueue units at CommitLog positions from
    ``from_position`` on (``broker.state.marker_digest``). ``marker_id``: the proposer's name
    for it (1..64 characters), by which it finds the entry's index."""

    marker_id: str
    from_position: int


AdminRecord = (CreateTopic | DeleteTopic | CommitOffset | RollbackHalf | CheckHalf | LockQueue
               | PutUser | DeleteUser | Grant | Revoke | VerifyMarker | PopRecord | AccessKeyRecord)


def record_kind(record: bytes) -> int | None:
    """The kind of a record from its first bytes, without decoding the rest."""
    if not record:
        return None
    head = record[0]
    if head == RECORD_KIND:
        return RECORD_KIND
    if 0x91 <= head <= 0x9F or head in (0xDC, 0xDD):  # an array
        start = 1 if head <= 0x9F else (3 if head == 0xDC else 5)
        if len(record) > start:
            first = record[start]
            if first < 0x80:
                return first
            if first == 0xCC and len(record) > start + 1:
                return record[start + 1]
    return None


def encode_admin(record: AdminRecord) -> bytes:
    row: list[object]
    if isinstance(record, POP_TYPES):
        row = pop_row(record)
    elif isinstance(record, ACCESS_KEY_TYPES):
        row = access_key_row(record)
    elif isinstance(record, CreateTopic):
        row = [RecordKind.CREATE_TOPIC, record.topic, record.queues, int(record.perm)]
    elif isinstance(record, DeleteTopic):
        row = [RecordKind.DELETE_TOPIC, record.topic]
    elif isinstance(record, RollbackHalf):
        row = [RecordKind.ROLLBACK_HALF, record.position]
    elif isinstance(record, CheckHalf):
        row = [RecordKind.CHECK_HALF, record.position, record.at_ms]
    elif isinstance(record, LockQueue):
        row = [RecordKind.LOCK_QUEUE, record.group, record.client_id, record.topic, record.queue_id,
               record.lock]
    elif isinstance(record, PutUser):
        row = [RecordKind.PUT_USER, record.user, record.super, record.salt, record.iterations,
               record.stored_key, record.server_key]
    elif isinstance(record, DeleteUser):
        row = [RecordKind.DELETE_USER, record.user]
    elif isinstance(record, VerifyMarker):
        row = [RecordKind.VERIFY_MARKER, record.marker_id, record.from_position]
    elif isinstance(record, Grant):  # Revoke too
        kind = RecordKind.REVOKE if isinstance(record, Revoke) else RecordKind.GRANT
        row = [kind, record.user, record.resource, record.decision, record.source, list(record.actions)]
    else:
        row = [RecordKind.COMMIT_OFFSET, record.group, record.topic, record.queue_id, record.offset]
    return msgpack.packb(row, use_bin_type=True)


def decode_admin(record: bytes) -> AdminRecord:
    """Decode an admin record; ValueError if malformed or not an admin kind."""
    try:
        row = msgpack.unpackb(record, use_list=True, raw=False)
    except Exception as e:
        raise ValueError(f"malformed record: {e}") from None
    if not isinstance(row, list) or not row:
        raise ValueError("a record is a non-empty array")
    kind, args = row[0], row[1:]
    try:
        if kind == RecordKind.CREATE_TOPIC:
            topic, queues, perm = args
            if not (isinstance(topic, str) and isinstance(queues, int) and 0 < queues <= 1024):
                raise ValueError("bad create-topic record")
            if perm not in (2, 4, 6):
                raise ValueError("perm must be 2, 4 or 6")
            return CreateTopic(topic, queues, Perm(perm))
        if kind == RecordKind.DELETE_TOPIC:
            (topic,) = args
            if not isinstance(topic, str):
                raise ValueError("bad delete-topic record")
            return DeleteTopic(topic)
        if kind == RecordKind.COMMIT_OFFSET:
            group, topic, queue_id, offset = args
            if not (isinstance(group, str) and isinstance(topic, str)
                    and isinstance(queue_id, int) and isinstance(offset, int) and offset >= 0):
                raise ValueError("bad commit-offset record")
            return CommitOffset(group, topic, queue_id, offset)
        if kind == RecordKind.ROLLBACK_HALF:
            (position,) = args
            if not (isinstance(position, int) and position >= 0):
                raise ValueError("bad rollback record")
            return RollbackHalf(position)
        if kind == RecordKind.CHECK_HALF:
            position, at_ms = args
            if not (isinstance(position, int) and position >= 0 and isinstance(at_ms, int)):
                raise ValueError("bad check record")
            return CheckHalf(position, at_ms)
        if kind == RecordKind.LOCK_QUEUE:
            group, client_id, topic, queue_id, lock = args
            if not (isinstance(group, str) and isinstance(client_id, str) and client_id
                    and isinstance(topic, str) and type(queue_id) is int and queue_id >= 0
                    and isinstance(lock, bool)):
                raise ValueError("bad lock-queue record")
            return LockQueue(group, client_id, topic, queue_id, lock)
        if kind == RecordKind.VERIFY_MARKER:
            marker_id, from_position = args
            if not (isinstance(marker_id, str) and 0 < len(marker_id) <= 64
                    and type(from_position) is int and from_position >= 0):
                raise ValueError("bad verify-marker record")
            return VerifyMarker(marker_id, from_position)
        if kind in _ACCESS_KINDS:
            return _decode_access(kind, args)
        if kind in POP_KINDS:
            return decode_pop(kind, args)
        if kind in ACCESS_KEY_KINDS:
            return decode_access_key(kind, args)
    except (TypeError, ValueError) as e:
        raise ValueError(f"malformed record of kind {kind}: {e}") from None
    raise ValueError(f"unknown record kind {kind!r}")


_ACCESS_KINDS = frozenset({RecordKind.PUT_USER, RecordKind.DELETE_USER, RecordKind.GRANT, RecordKind.REVOKE})


def _decode_access(kind: int, args: list[object]) -> AdminRecord:
    """A user or policy record (the leader checked its names and texts before proposing)."""
    if kind == RecordKind.PUT_USER:
        user, is_super, salt, iterations, stored_key, server_key = args
        if not (isinstance(user, str) and user and isinstance(is_super, bool) and isinstance(salt, bytes)
                and type(iterations) is int and iterations > 0 and isinstance(stored_key, bytes)
                and isinstance(server_key, bytes)):
            raise ValueError("bad put-user record")
        return PutUser(user, is_super, salt, iterations, stored_key, server_key)
    if kind == RecordKind.DELETE_USER:
        (user,) = args
        if not (isinstance(user, str) and user):
            raise ValueError("bad delete-user record")
        return DeleteUser(user)
    user, resource, decision, source, actions = args
    if not (isinstance(user, str) and isinstance(resource, str) and decision in ("allow", "deny")
            and isinstance(source, str) and isinstance(actions, list)
            and all(isinstance(a, str) for a in actions)):
        raise ValueError("bad policy record")
    cls = Revoke if kind == RecordKind.REVOKE else Grant
    return cls(user, resource, str(decision), source, tuple(str(a) for a in actions))
