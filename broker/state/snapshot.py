"""A broker replica's derived state at one log index: the snapshot a replica behind the
retained log start is sent, and the digest replicas compare.

The apply step takes one just before the first entry of every CommitLog segment (an
entry whose position is a multiple of ``segment_bytes``), at S = that entry's index - 1.
Retention deletes whole segments, so whenever it cuts the log at a segment start B, the
state at B - 1 exists; a replica given it and the log from B derives exactly what its
peers derive. Its ConsumeQueues start at the snapshot's next offsets: the peers'
numbering.

File ``store/snapshots/<S, 20 digits>.snap`` (msgpack, written atomically)::

    {"v": 1,
     "index": S,
     "digest": "<sha256 hex of the state's canonical bytes>",
     "state": {                                     every map's keys sorted (canonical)
        "topics":    {topic: [queues, perm]},
        "queues":    {topic: {queue id: next queue offset}},
        "offsets":   {group: {topic: {queue id: committed offset}}},
        "producers": {"producer\\0topic\\0queue": [last sequence, [[base sequence, count,
                                                      base offset], ...], last ms]},
        "timers":    {position: [size, due ms, topic(, carried to)]},
        "halves":    {position: [size, next check ms, checks, producer group, topic(, carried to)]},
                             (carried to: where a carried-forward copy holds its bytes,
                             broker.deferred.carry_forward; absent until it is carried)
        "locks":     {"group\\0topic\\0queue": [client id, ms]},
        "sent_back": {"group:position": ms},
        "pops":      {"group\\0topic\\0queue": [next, floor, [settled], [[offset, deadline ms,
                                                  delivery], ...]]}   only when not empty
        "retry":     {group: [[backoff ms, ...], max deliveries]}      (broker.state.pops)
        "users":     {user: [super, salt, iterations, stored key, server key]}   only when
        "policies":  {"user\\0resource\\0decision\\0source": [actions]}        not empty
                             (broker.state.access: a state without users keeps its form)
        "last_store_ms": int,
        "cq_hash":   16 bytes, the running 128-bit hash of every ConsumeQueue unit appended, in
                             log order (``cq_hash_step``): equal only if the same units
                             went to the same queues at the same offsets
     }}

Equal states encode to equal bytes, so two replicas' digests at one index are equal
exactly when their derived state is (the IndexFile is not part of it: a replica
restored from a snapshot indexes only the messages it holds).
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mmh3
import msgpack

from common.durable_file import atomic_write

__all__ = ["VERSION", "Snapshot", "SnapshotError", "SnapshotStore", "canonical_bytes", "cq_hash_prefix",
           "cq_hash_step"]

VERSION = 2  # 2: records, one ConsumeQueue unit each; producers' windows by record
_MASK = (1 << 128) - 1
_MULTIPLIER = 0x9E3779B97F4A7C15F39CC0605CEDC835  # odd: the step is a bijection of the old hash
_NAME = re.compile(r"^(\d{20})\.snap$")
_UNIT = struct.Struct(">qqiHBqq")  # base offset, position, size, count, tag kind, store ms, tag


class SnapshotError(ValueError):
    """A snapshot that is not one, or whose digest does not match its state."""


def cq_hash_prefix(topic: str, queue_id: int) -> bytes:
    """What ``cq_hash_step`` hashes before a unit of this queue (computed once per queue)."""
    return f"{topic}\0{queue_id}\0".encode()


def cq_hash_step(h: int, prefix: bytes, unit: tuple[int, int, int, int, int, int, int]) -> int:
    """The running ConsumeQueue hash after one more unit (position, size, count, tag kind,
    base offset, store ms, tag) of the queue whose ``cq_hash_prefix`` is ``prefix``
    (order-sensitive)."""
    position, size, count, kind, base, store_ms, tag = unit
    return (h * _MULTIPLIER + mmh3.hash128(prefix + _UNIT.pack(base, position, size, count, kind, store_ms,
                                                                tag), signed=False)) & _MASK


def _canonical(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _canonical(obj[k]) for k in sorted(obj, key=lambda k: (type(k).__name__, k))}
    if isinstance(obj, list | tuple):
        return [_canonical(v) for v in obj]
    return obj


def canonical_bytes(state: dict[str, Any]) -> bytes:
    """msgpack of ``state`` with every map's keys sorted: equal states, equal bytes."""
    return msgpack.packb(_canonical(state), use_bin_type=True)


@dataclass(frozen=True, slots=True)
class Snapshot:
    index: int
    state: dict[str, Any]
    digest: str

    @classmethod
    def of(cls, index: int, state: dict[str, Any]) -> Snapshot:
        return cls(index, state, hashlib.sha256(canonical_bytes(state)).hexdigest())

    def encode(self) -> bytes:
        return msgpack.packb({"v": VERSION, "index": self.index, "digest": self.digest,
                              "state": _canonical(self.state)}, use_bin_type=True)

    @classmethod
    def decode(cls, data: bytes) -> Snapshot:
        """Raises SnapshotError for anything but an intact snapshot of this version."""
        try:
            doc = msgpack.unpackb(data, strict_map_key=False)
        except Exception as e:
            raise SnapshotError(f"not a broker snapshot: {e}") from None
        if not isinstance(doc, dict) or doc.get("v") != VERSION or not isinstance(doc.get("state"), dict):
            raise SnapshotError(f"not a broker snapshot of version {VERSION}")
        snap = cls.of(int(doc["index"]), doc["state"])
        if snap.digest != doc.get("digest"):
            raise SnapshotError(f"snapshot at {snap.index} is damaged: its state does not match its digest")
        return snap


class SnapshotStore:
    """The snapshot files of one replica (``store/snapshots``). Apply thread writes; any
    thread reads."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        for tmp in directory.glob("*.tmp"):
            tmp.unlink(missing_ok=True)

    def path(self, index: int) -> Path:
        return self.directory / f"{index:020d}.snap"

    def write(self, snap: Snapshot) -> None:
        atomic_write(self.path(snap.index), snap.encode())

    def indexes(self) -> list[int]:
        return sorted(int(m.group(1)) for p in self.directory.iterdir() if (m := _NAME.match(p.name)))

    def read(self, index: int) -> bytes | None:
        try:
            return self.path(index).read_bytes()
        except FileNotFoundError:
            return None

    def load(self, index: int) -> Snapshot | None:
        data = self.read(index)
        return None if data is None else Snapshot.decode(data)

    def prune_below(self, index: int) -> int:
        """Delete the snapshots older than ``index``; returns how many."""
        old = [i for i in self.indexes() if i < index]
        for i in old:
            self.path(i).unlink(missing_ok=True)
        return len(old)
