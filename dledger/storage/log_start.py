"""The leader's retained start, as the "full dump" pysyncobj ships to a lagging follower.

Log compaction is off, so pysyncobj's snapshot install is reached only for a
follower whose next entry the leader no longer holds (retention deleted it).
RaftMQ uses that path to restart the follower's log at the leader's first two
retained entries, at the same positions (DLedger's truncate-to-begin-index), and
to hand the follower's state machine the snapshot of the state just before them,
so that it derives exactly what its peers derive. pysyncobj streams the file
verbatim in chunks; ``ReplicatedLog`` writes it whenever the first retained entry
changes and reads it through the ``deserializer`` hook.

File layout (msgpack), version 3::

    {"v": 3,
     "entries": [[command, index, term, position],    # first retained entry F
                 [command, index, term, position]],   # the one after it
     "state_ref": [size, "<sha256 hex>"] | nil,       # the state machine's snapshot after
                                                      # F - 1: its size and checksum; the
                                                      # follower fetches the bytes itself,
                                                      # in resumable chunks (snapshot_fetch)
     "members": ["<member id>", ...]}                 # the group's members after F - 1
                                                      # (dledger.membership; optional)

Older leaders' dumps are still read (a rolling upgrade): version 2 carries the snapshot
bytes inline (``"state": <bytes>, "sha256": "<hex>"``) -- pysyncobj's transfer of them
restarts from the first byte whenever the connection breaks, hence version 3; version 1
has no state at all, and the follower's state machine then says it has nothing to
continue from.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import msgpack

__all__ = ["DumpEntry", "LogStart", "StateRef", "decode_log_start", "encode_log_start"]

VERSION = 3


@dataclass(frozen=True, slots=True)
class DumpEntry:
    command: bytes
    index: int
    term: int
    position: int

    @property
    def raft_tuple(self) -> tuple[bytes, int, int]:
        return (self.command, self.index, self.term)


@dataclass(frozen=True, slots=True)
class StateRef:
    """Which snapshot a follower must fetch: the state after ``index``, ``size`` bytes."""

    index: int
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class LogStart:
    first: DumpEntry
    second: DumpEntry
    state: bytes | None = None  # the state after first.index - 1, inline (version 2)
    members: list[str] | None = None  # member ids after first.index - 1
    state_ref: StateRef | None = None  # the state after first.index - 1, to fetch (version 3)

    @property
    def state_index(self) -> int:
        return self.first.index - 1


def encode_log_start(first: DumpEntry, second: DumpEntry, state: bytes | None = None,
                     members: list[str] | None = None) -> bytes:
    """The dump naming ``state`` (the snapshot after ``first.index - 1``) by size and checksum."""
    if second.index != first.index + 1 or second.position <= first.position:
        raise ValueError("log start entries must be consecutive")
    rows = [[e.command, e.index, e.term, e.position] for e in (first, second)]
    ref = None if state is None else [len(state), hashlib.sha256(state).hexdigest()]
    return msgpack.packb({"v": VERSION, "entries": rows, "state_ref": ref, "members": members},
                         use_bin_type=True)


def decode_log_start(data: bytes) -> LogStart:
    """Raises ValueError for anything but an intact dump (a damaged inline state included)."""
    try:
        doc = msgpack.unpackb(data)
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as e:
        raise ValueError(f"not a RaftMQ log-start dump: {e}") from None
    if not isinstance(doc, dict) or doc.get("v") not in (1, 2, VERSION) or len(doc.get("entries", ())) != 2:
        raise ValueError("not a RaftMQ log-start dump")
    first, second = (DumpEntry(bytes(c), int(i), int(t), int(p)) for c, i, t, p in doc["entries"])
    if second.index != first.index + 1:
        raise ValueError("log start entries are not consecutive")
    state = doc.get("state")
    if state is not None and hashlib.sha256(state).hexdigest() != doc.get("sha256"):
        raise ValueError(f"the state snapshot at {first.index - 1} in the log-start dump is damaged "
                         "(checksum mismatch)")
    ref = doc.get("state_ref")
    state_ref = None
    if ref is not None:
        if not (isinstance(ref, list) and len(ref) == 2 and isinstance(ref[0], int) and ref[0] >= 0
                and isinstance(ref[1], str) and len(ref[1]) == 64):
            raise ValueError("the state reference in the log-start dump is malformed")
        state_ref = StateRef(first.index - 1, ref[0], ref[1])
    members = doc.get("members")
    if members is not None and not (isinstance(members, list) and all(isinstance(m, str) for m in members)):
        raise ValueError("the member list in the log-start dump is malformed")
    return LogStart(first, second, None if state is None else bytes(state), members, state_ref)
