"""The Raft hard state -- current term, vote, commit hint -- in a file overwritten in place.

Raft makes the term and the vote durable before it answers a vote request or follows a
leader of a new term. Written by replacement (a temp file, fsync, rename) that needs
a new block each time, which a full disk does not have: the node could then neither vote
nor follow, and its term would climb with every failed election. This file is allocated
once, written whole (``durable_file.atomic_write``), and from then on only overwritten
in place -- no allocation, so it keeps working on a full disk. Two slots, each in its own
4 KiB page, are written in turn; each carries a sequence number and a CRC, and the valid
slot with the higher sequence is the state. A torn write can only spoil the slot being
written, whose neighbour still holds the state before it::

    file (8192 bytes):  [ slot A | zeros to 4096 ][ slot B | zeros to 8192 ]

    slot (512 bytes, big-endian):
    ┌───────────┬─────────┬──────────┬────────────┬──────────────┬─────────────────┬───────────┐
    │ magic (4) │ seq u64 │ term u64 │ commit u64 │ vote_len u16 │ vote (478, pad) │ crc32 (4) │
    └───────────┴─────────┴──────────┴────────────┴──────────────┴─────────────────┴───────────┘
      0           4         12         20           28             30                508

* ``magic`` is ``b"RMHS"``; ``crc32`` is ``zlib.crc32`` of the 508 bytes before it;
* ``vote`` is the UTF-8 node id voted for in ``term`` (``vote_len`` bytes, then zeros);
  ``vote_len`` 0 means no vote;
* ``commit`` is a restart hint (the committed index last persisted), not a promise.

A file of any other size is the earlier form (a msgpack map ``{"term", "voted_for",
"commit"}`` replaced whole): it is read once and rewritten in this form.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import msgpack

from common.durable_file import atomic_write, read_or_none
from dledger.storage.numbered_files import pwrite_all

__all__ = ["FILE_SIZE", "MAX_VOTE_BYTES", "SLOT_SIZE", "HardState", "HardStateCorrupt", "HardStateFile",
           "decode_slot", "encode_slot", "probe"]

MAGIC = b"RMHS"
SLOT_SIZE = 512
PAGE = 4096
FILE_SIZE = 2 * PAGE
_HEAD = struct.Struct(">4sQQQH")
_CRC = struct.Struct(">I")
MAX_VOTE_BYTES = SLOT_SIZE - _HEAD.size - _CRC.size
assert _HEAD.size == 30 and MAX_VOTE_BYTES == 478


class HardStateCorrupt(ValueError):
    """Neither slot of the file holds a valid state; the message names the file."""


@dataclass(frozen=True, slots=True)
class HardState:
    term: int = 0
    voted_for: str | None = None
    commit: int = 0


def encode_slot(seq: int, state: HardState) -> bytes:
    """The 512 bytes of a slot. Raises ValueError for a vote longer than MAX_VOTE_BYTES."""
    vote = (state.voted_for or "").encode()
    if len(vote) > MAX_VOTE_BYTES:
        raise ValueError(f"a vote for a node id of {len(vote)} bytes (at most {MAX_VOTE_BYTES})")
    body = _HEAD.pack(MAGIC, seq, state.term, state.commit, len(vote)) + vote.ljust(MAX_VOTE_BYTES, b"\0")
    return body + _CRC.pack(zlib.crc32(body))


def decode_slot(data: bytes) -> tuple[int, HardState] | None:
    """(seq, state) of a slot, or None if it is not a valid one (blank, torn, damaged)."""
    if len(data) < SLOT_SIZE:
        return None
    body, (crc,) = data[:SLOT_SIZE - _CRC.size], _CRC.unpack_from(data, SLOT_SIZE - _CRC.size)
    if zlib.crc32(body) != crc:
        return None
    magic, seq, term, commit, vote_len = _HEAD.unpack_from(body)
    if magic != MAGIC or vote_len > MAX_VOTE_BYTES:
        return None
    vote = body[_HEAD.size:_HEAD.size + vote_len].decode(errors="replace") if vote_len else None
    return seq, HardState(term, vote, commit)


def probe(path: Path) -> tuple[str, HardState | None]:
    """Whether the hard state at ``path`` is ``"ok"`` (with it), ``"absent"`` or ``"corrupt"``,
    without creating or changing anything."""
    data = read_or_none(Path(path))
    if data is None:
        return "absent", None
    if len(data) != FILE_SIZE:
        try:
            legacy = msgpack.unpackb(data) if data else {}
            return "ok", HardState(int(legacy.get("term", 0)), legacy.get("voted_for"),
                                   int(legacy.get("commit", 0)))
        except Exception:
            return "corrupt", None
    slots = [s for s in (decode_slot(data[:SLOT_SIZE]), decode_slot(data[PAGE:PAGE + SLOT_SIZE])) if s]
    return ("ok", max(slots, key=lambda s: s[0])[1]) if slots else ("corrupt", None)


class HardStateFile:
    """The hard state at ``path`` (created, or converted from the earlier form, on open).

    One writer (pysyncobj's tick thread, through the journal). ``save`` is durable when it
    returns. Raises HardStateCorrupt on open when neither slot is valid, OSError.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        data = read_or_none(self.path)
        if data is None or len(data) != FILE_SIZE:
            legacy = msgpack.unpackb(data) if data else {}
            self.state = HardState(legacy.get("term", 0), legacy.get("voted_for"), legacy.get("commit", 0))
            self._seq = 1
            atomic_write(self.path, encode_slot(self._seq, self.state).ljust(FILE_SIZE, b"\0"))
        else:
            slots = [s for s in (decode_slot(data[:SLOT_SIZE]), decode_slot(data[PAGE:PAGE + SLOT_SIZE]))
                     if s is not None]
            if not slots:
                raise HardStateCorrupt(f"{self.path}: neither copy of the Raft term and vote is intact; "
                                       "the node cannot know whom it voted for. A replica starting moves "
                                       "it aside and catches up as a new storage before it votes")
            self._seq, self.state = max(slots, key=lambda s: s[0])
        self._fd = os.open(self.path, os.O_RDWR)

    def save(self, state: HardState) -> None:
        """Overwrite the older slot with ``state`` and fsync. Raises OSError (the state held
        before is then still the one on disk), ValueError for a vote too long."""
        slot = encode_slot(self._seq + 1, state)
        pwrite_all(self._fd, slot, ((self._seq + 1) % 2) * PAGE)
        os.fsync(self._fd)
        self._seq += 1
        self.state = state

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
