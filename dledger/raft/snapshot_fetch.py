"""Snapshot transfer: a follower restarted at the leader's retained start fetches the state
snapshot in checksummed chunks, and a broken transfer resumes where it stopped.

pysyncobj ships the log-start dump (``dledger.storage.log_start``), which names the snapshot of
the state before the retained start by index, size and SHA-256. The follower then pulls
the bytes over the group's own authenticated peer connections (pysyncobj's, the way
``dledger.raft.election.prevote`` talks), one chunk at a time, from the leader first and from any other
member holding that snapshot when the leader does not answer::

    follower                                                member holding the snapshot
      snapshot_read{index, offset, sha256}  ---------------------->
                             <---------  snapshot_chunk{index, offset, total, sha256,
                                                        data (<= CHUNK_BYTES), crc32}
                             <---------  snapshot_chunk{index, offset, error}   (not held)
                             <---------  snapshot_chunk{index, offset, error,
                                                        later{index, size, sha256}}

A request also says ``or_later_upto``: the follower's committed index. Retention may have
pruned the named snapshot on every member while the follower was still fetching it (its log
was caught up, so nothing held the cut back); a member that does not hold it then names
the oldest snapshot it holds after it, up to that index, and the follower fetches that one
instead -- the state after a later entry its committed log reaches is as good a start
(every replica derives the same state at an index), and applying goes on after it.

    data_dir/
      snapshot-fetch.want   msgpack [index, size, sha256]: what is being fetched
      snapshot-fetch.part   the bytes received so far, each chunk fsynced when written:
                            the next request's offset is this file's length

A chunk whose CRC-32 does not match is dropped and asked for again; a finished file whose
SHA-256 does not match is discarded and fetched from the start. A request without an
answer within ``REQUEST_TIMEOUT_S`` goes to the next member. A restart of the follower
resumes from the part file. Any member answers, since every replica takes its snapshots
at the same indexes (segment starts; equal logs give equal positions).

Bounds: one request outstanding per follower; a chunk is at most ``CHUNK_BYTES``; a
snapshot larger than ``MAX_SNAPSHOT_BYTES`` is refused; the serving side keeps the one
snapshot it serves in memory. Every method runs on pysyncobj's tick thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack

from common.durable_file import atomic_write, read_or_none
from dledger.storage.log_start import StateRef

__all__ = ["CHUNK_BYTES", "MAX_SNAPSHOT_BYTES", "REQUEST_TIMEOUT_S", "SnapshotFetch"]

log = logging.getLogger(__name__)

CHUNK_BYTES = 256 * 1024
REQUEST_TIMEOUT_S = 3.0
MAX_SNAPSHOT_BYTES = 1 << 30
WANT = "snapshot-fetch.want"
PART = "snapshot-fetch.part"


class SnapshotFetch:
    """One replica's side of snapshot transfers: fetching the one it needs, serving others."""

    def __init__(self, directory: Path, *, members: Callable[[], Sequence[Any]],
                 leader: Callable[[], Any | None], send: Callable[[Any, dict[str, Any]], Any],
                 snapshot_bytes: Callable[[int], bytes | None],
                 done: Callable[[int, bytes], None],
                 held_indexes: Callable[[], Sequence[int]] = tuple,
                 reachable: Callable[[], int] = lambda: 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``members``: the other members' pysyncobj nodes; ``leader``: the node of the
        leader known, if any; ``send(node, message)``; ``snapshot_bytes(index)``: this
        replica's own snapshots (to serve), ``held_indexes()`` their indexes; ``done(index,
        data)``: a fetched, verified one; ``reachable()``: this replica's committed index (a
        later snapshot up to it will do)."""
        self._dir = directory
        self._held_indexes, self._reachable = held_indexes, reachable
        self._members, self._leader, self._send = members, leader, send
        self._snapshot_bytes, self._done, self._clock = snapshot_bytes, done, clock
        self._want: StateRef | None = None
        self._have = 0
        self._asked: Any | None = None  # the node the outstanding request went to
        self._asked_at = 0.0
        self._skip: list[Any] = []  # members that did not answer or do not hold it
        self._serving: tuple[int, bytes, str] | None = None
        self.chunks_received = 0
        self.bytes_received = 0
        self.restarts = 0  # whole-file checksum failures
        self._resume()

    # -- what to fetch -------------------------------------------------------------
    @property
    def wanted(self) -> StateRef | None:
        return self._want

    def progress(self) -> dict[str, Any] | None:
        """For /status: the fetch under way, if any."""
        if self._want is None:
            return None
        return {"index": self._want.index, "received": self._have, "size": self._want.size,
                "from": getattr(self._asked, "name", None) or getattr(self._asked, "address", None)}

    def want(self, ref: StateRef) -> None:
        """Fetch ``ref`` (from the log-start dump); a part of it fetched before is kept."""
        if ref.size > MAX_SNAPSHOT_BYTES:
            log.error("the snapshot at %d is %d bytes, more than this replica accepts (%d)",
                      ref.index, ref.size, MAX_SNAPSHOT_BYTES)
            return
        if ref == self._want:
            return
        if self._want is not None and ref.index < self._want.index:
            return  # the leader sent its install again: the later snapshot fetched instead will do
        self._discard()
        atomic_write(self._dir / WANT, msgpack.packb([ref.index, ref.size, ref.sha256]))
        self._want, self._have, self._skip = ref, 0, []
        log.info("fetching the state snapshot at %d (%d bytes) in chunks of %d", ref.index, ref.size,
                 CHUNK_BYTES)
        self._finish_if_complete()

    def _resume(self) -> None:
        raw = read_or_none(self._dir / WANT)
        if raw is None:
            return
        try:
            index, size, sha = msgpack.unpackb(raw)
            ref = StateRef(int(index), int(size), str(sha))
        except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError):
            self._discard()
            return
        part = self._dir / PART
        have = part.stat().st_size if part.exists() else 0
        if have > ref.size:
            part.unlink()
            have = 0
        self._want, self._have = ref, have
        log.info("resuming the fetch of the state snapshot at %d: %d of %d bytes held", ref.index,
                 have, ref.size)

    def _discard(self) -> None:
        for name in (WANT, PART):
            (self._dir / name).unlink(missing_ok=True)
        self._want, self._have, self._asked = None, 0, None

    # -- the fetching side -----------------------------------------------------------
    def tick(self) -> None:
        if self._want is None:
            return
        if self._asked is not None:
            if self._clock() - self._asked_at < REQUEST_TIMEOUT_S:
                return
            log.info("no answer from %s for the snapshot at %d within %.0f s: asking another member",
                     getattr(self._asked, "name", self._asked), self._want.index, REQUEST_TIMEOUT_S)
            self._skip.append(self._asked)
            self._asked = None
        self._ask()

    def _ask(self) -> None:
        assert self._want is not None
        node = self._pick()
        if node is not None:
            self._ask_from(node)

    def _pick(self) -> Any | None:
        members = list(self._members())
        leader = self._leader()
        order = ([leader] if leader is not None else []) + [m for m in members if m != leader]
        fresh = [m for m in order if m not in self._skip]
        if not fresh:  # everyone was tried: start the round again
            self._skip = []
            fresh = order
        return fresh[0] if fresh else None

    def _receive(self, node: Any, message: dict[str, Any]) -> None:
        want = self._want
        if want is None or message.get("index") != want.index or node != self._asked:
            return  # not what was asked for (a late answer, another transfer)
        self._asked = None
        if message.get("error"):
            later = _later_ref(message.get("later"))
            if later is not None and want.index < later.index <= self._reachable() \
                    and later.size <= MAX_SNAPSHOT_BYTES:
                log.warning("no member holds the snapshot at %d any more (retention); %s holds "
                            "one at %d, which this replica's committed log reaches: fetching it",
                            want.index, getattr(node, "name", node), later.index)
                self.want(later)
                return
            log.info("%s does not hold the snapshot at %d (%s): asking another member",
                     getattr(node, "name", node), want.index, message["error"])
            self._skip.append(node)
            return
        data, offset = message.get("data"), message.get("offset")
        if message.get("total") != want.size or message.get("sha256") != want.sha256:
            log.error("%s offered another snapshot at %d than the leader named (size %s, not %d)",
                      getattr(node, "name", node), want.index, message.get("total"), want.size)
            self._skip.append(node)
            return
        if not isinstance(data, bytes) or offset != self._have or len(data) > CHUNK_BYTES \
                or offset + len(data) > want.size or (not data and offset < want.size):
            return  # malformed or stale: asked again at the next tick
        if zlib.crc32(data) != message.get("crc32"):
            log.warning("a chunk of the snapshot at %d from %s failed its CRC-32: asking again",
                        want.index, getattr(node, "name", node))
            return
        with open(self._dir / PART, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self._have += len(data)
        self.chunks_received += 1
        self.bytes_received += len(data)
        if not self._finish_if_complete():
            self._ask_from(node)

    def _ask_from(self, node: Any) -> None:
        assert self._want is not None
        self._asked, self._asked_at = node, self._clock()
        self._send(node, {"type": "snapshot_read", "index": self._want.index, "offset": self._have,
                          "sha256": self._want.sha256, "or_later_upto": self._reachable()})

    def _finish_if_complete(self) -> bool:
        want = self._want
        if want is None or self._have < want.size:
            return False
        data = read_or_none(self._dir / PART) or b""
        if hashlib.sha256(data).hexdigest() != want.sha256:
            self.restarts += 1
            log.error("the snapshot at %d fetched does not match its SHA-256: fetching it again",
                      want.index)
            (self._dir / PART).unlink(missing_ok=True)
            self._have = 0
            return False
        self._done(want.index, data)
        log.info("fetched the state snapshot at %d (%d bytes, %d chunks)", want.index, len(data),
                 self.chunks_received)
        self._discard()
        return True

    # -- the serving side ------------------------------------------------------------
    def _serve(self, node: Any, message: dict[str, Any]) -> None:
        index, offset = message.get("index"), message.get("offset")
        if not isinstance(index, int) or not isinstance(offset, int) or offset < 0:
            return
        reply: dict[str, Any] = {"type": "snapshot_chunk", "index": index, "offset": offset}
        held = self._held(index)
        if held is None:
            reply["error"] = "not held"
            upto = message.get("or_later_upto")
            if isinstance(upto, int):
                later = self._later_than(index, upto)
                if later is not None:
                    reply["later"] = later
        else:
            data, sha = held
            if message.get("sha256") != sha:
                reply["error"] = "another snapshot at this index"
            else:
                chunk = data[offset:offset + CHUNK_BYTES]
                reply.update(total=len(data), sha256=sha, data=chunk, crc32=zlib.crc32(chunk))
                who = getattr(node, "name", None) or getattr(node, "address", node)
                if offset == 0:
                    log.info("sending the state snapshot at %d (%d bytes) to %s", index, len(data), who)
                elif chunk and offset + len(chunk) == len(data):
                    log.info("sent the last chunk of the state snapshot at %d to %s", index, who)
        self._send(node, reply)

    def _held(self, index: int) -> tuple[bytes, str] | None:
        if self._serving is None or self._serving[0] != index:
            data = None
            with contextlib.suppress(OSError):
                data = self._snapshot_bytes(index)
            if data is None:
                return None
            self._serving = (index, data, hashlib.sha256(data).hexdigest())
        return self._serving[1], self._serving[2]

    def _later_than(self, index: int, upto: int) -> dict[str, Any] | None:
        """The oldest snapshot held after ``index``, up to ``upto``, as a request names one."""
        for later in sorted(i for i in self._held_indexes() if index < i <= upto):
            held = self._held(later)
            if held is not None:
                return {"index": later, "size": len(held[0]), "sha256": held[1]}
        return None

    # -- messages (GroupTransport hands them here) -------------------------------------
    def on_message(self, node: Any, message: dict[str, Any]) -> bool:
        """True if ``message`` was a snapshot transfer message (consumed)."""
        kind = message.get("type")
        if kind == "snapshot_read":
            self._serve(node, message)
            return True
        if kind == "snapshot_chunk":
            self._receive(node, message)
            return True
        return False


def _later_ref(offer: Any) -> StateRef | None:
    """A ``later`` offer of a chunk answer, if well formed."""
    if not isinstance(offer, dict):
        return None
    index, size, sha = offer.get("index"), offer.get("size"), offer.get("sha256")
    if not (isinstance(index, int) and isinstance(size, int) and isinstance(sha, str)) or size < 0:
        return None
    return StateRef(index, size, sha)
