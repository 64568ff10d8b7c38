"""The leader's retained start, as the "full dump" pysyncobj ships to a lagging follower.

Log compaction is off, so pysyncobj's snapshot install is reached only for a
follower whose next entry the leader no longer holds (retention deleted it).
RaftMQ uses that path to restart the follower's log at the leader's first two
retained entries, at the same positions (DLedger's truncate-to-begin-index).
pysyncobj streams the file verbatim; ``ReplicatedLog`` writes it whenever the
first retained entry changes and reads it through the ``deserializer`` hook.

File layout (msgpack)::

    {"v": 1, "entries": [[command, index, term, position],    # first retained entry
                         [command, index, term, position]]}   # the one after it
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

__all__ = ["DumpEntry", "decode_log_start", "encode_log_start"]

VERSION = 1


@dataclass(frozen=True, slots=True)
class DumpEntry:
    command: bytes
    index: int
    term: int
    position: int

    @property
    def raft_tuple(self) -> tuple[bytes, int, int]:
        return (self.command, self.index, self.term)


def encode_log_start(first: DumpEntry, second: DumpEntry) -> bytes:
    if second.index != first.index + 1 or second.position <= first.position:
        raise ValueError("log start entries must be consecutive")
    rows = [[e.command, e.index, e.term, e.position] for e in (first, second)]
    return msgpack.packb({"v": VERSION, "entries": rows})


def decode_log_start(data: bytes) -> tuple[DumpEntry, DumpEntry]:
    doc = msgpack.unpackb(data)
    if not isinstance(doc, dict) or doc.get("v") != VERSION or len(doc.get("entries", ())) != 2:
        raise ValueError("not a RaftMQ log-start dump")
    first, second = (DumpEntry(bytes(c), int(i), int(t), int(p)) for c, i, t, p in doc["entries"])
    if second.index != first.index + 1:
        raise ValueError("log start entries are not consecutive")
    return first, second
