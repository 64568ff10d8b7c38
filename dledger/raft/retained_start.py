"""The retained start of one replica's log: the dump a leader writes of it, what a follower
behind it does with the leader's, and the state snapshot that goes with it.

    write()                       leader side: ``log-start.dump`` (``dledger.storage.log_start``) of
                                  the first two retained entries, their positions, the
                                  snapshot of the state before them and the members then;
                                  rewritten whenever the first retained entry changes
    read(filename)                pysyncobj's ``deserializer``: a follower behind the leader's
                                  retained start restarts its log there and fetches the
                                  snapshot (``dledger.raft.snapshot_fetch``)
    received() / forget_received()  the snapshot a follower received, until its state
                                  machine installed it (``received-snapshot``)
    finish_interrupted_reset(..)  at start: a crash between a log restart and its first two
                                  appends is finished from the dump file

Threads: ``write`` on the constructing thread and the tick thread (retention); ``read`` on
the tick thread; ``received``/``forget_received`` on the applier's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from common.durable_file import atomic_write
from dledger.config import ConfigError
from dledger.log_events import SnapshotSource
from dledger.membership import Member, MemberHistory
from dledger.raft.codec import decode_command
from dledger.raft.journal import RaftJournal
from dledger.storage.commitlog import CommitLog
from dledger.storage.log_start import DumpEntry, StateRef, decode_log_start, encode_log_start

__all__ = ["RetainedStart", "SnapshotSource", "finish_interrupted_reset"]

log = logging.getLogger("dledger.replicated_log")


class RetainedStart:
    """The dump and received-snapshot files of one replica (module docstring)."""

    def __init__(self, data_dir: Path, commitlog: CommitLog, journal: RaftJournal, history: MemberHistory, *,
                 want_snapshot: Callable[[StateRef], None],
                 restarted: Callable[[int, dict[str, Member] | None], None],
                 nodes: Callable[[], list[Any]], sender: Callable[[], Any]) -> None:
        """For ``read``: ``want_snapshot(ref)`` fetches a snapshot; ``restarted(index,
        members)``: the log restarts after ``index`` with those members (None: unknown);
        ``nodes()``: pysyncobj's nodes of the members; ``sender()``: the node entries come
        from (None: unknown)."""
        self.dump_path = dump_path(data_dir)
        self.received_path = data_dir / "received-snapshot"
        self._commitlog = commitlog
        self._journal = journal
        self._history = history
        self._want_snapshot = want_snapshot
        self._restarted = restarted
        self._nodes = nodes
        self._sender = sender
        self.snapshots: SnapshotSource | None = None
        self.at_startup = True  # pysyncobj loads our own dump file at its first tick

    def write(self) -> None:
        """Rewrite the dump of the retained start (nothing while the log has not been cut)."""
        cl = self._commitlog
        if cl.first_index <= 1 or len(cl) < 2:
            return
        first, second = (
            DumpEntry(*self._journal[i], position=cl.position_of(cl.first_index + i))
            for i in (0, 1))
        state = self.snapshots.snapshot_bytes(first.index - 1) if self.snapshots is not None else None
        if self.snapshots is not None and state is None:
            log.error("no snapshot of the state at %d: a follower behind the retained start "
                      "cannot be brought up to date by this node", first.index - 1)
        members = [m.member_id for m in self._history.at(first.index - 1).values()]
        atomic_write(self.dump_path, encode_log_start(first, second, state, members))

    def read(self, filename: str) -> tuple[Any, Any, list[Any]]:
        """pysyncobj's deserializer, on the tick thread of a follower behind the leader's
        retained start: keep the state snapshot durably, then restart the log. Returns
        pysyncobj's (last entry, first entry, nodes)."""
        with open(filename, "rb") as f:
            start = decode_log_start(f.read())
        cl = self._commitlog
        if self.at_startup and cl.first_index == start.first.index and len(cl) >= 2 and \
                cl.term_at(start.first.index) == start.first.term:
            # pysyncobj loads the dump file at start-up too (first tick): our own log start
            return start.second.raft_tuple, start.first.raft_tuple, self._nodes()
        if start.state_ref is not None:
            log.warning("the leader's log starts at %d, after this replica's: the log restarts "
                        "there, and the state snapshot at %d (%d bytes) is fetched",
                        start.first.index, start.state_index, start.state_ref.size)
            self._want_snapshot(start.state_ref)
        elif start.state is not None:  # a leader of an older version: the snapshot inline
            self.keep_received(start.state_index, start.state)
            log.warning("received the leader's state snapshot at index %d (%d bytes); the log "
                        "restarts at %d", start.state_index, len(start.state), start.first.index)
        else:
            log.error("the leader sent no state snapshot with its retained start %d",
                      start.first.index)
        self._journal.stage_reset(start.first.index, start.first.position)
        members = None
        if start.members is not None:
            members = {m.name: m for m in map(Member.parse, start.members)}
        self._restarted(start.first.index - 1, members)
        nodes = self._nodes()
        sender = self._sender()
        if sender is not None and sender not in nodes:
            # a member added after the snapshot: its change entry is still to come from it, so
            # pysyncobj must keep the connection it is receiving entries on
            nodes.append(sender)
        members_now = ", ".join(sorted(self._history.current()))
        log.info("members at the snapshot: %s (receiving from %s)", members_now,
                 getattr(sender, "name", None) or "an unknown leader")
        return start.second.raft_tuple, start.first.raft_tuple, nodes

    def keep_received(self, index: int, state: bytes) -> None:
        """The snapshot of the state after ``index``, durably, until it is installed."""
        atomic_write(self.received_path, msgpack.packb([index, state]))

    def received(self) -> tuple[int, bytes] | None:
        """(index, snapshot) the leader last sent with its retained start, if any."""
        try:
            index, state = msgpack.unpackb(self.received_path.read_bytes())
        except (OSError, ValueError):
            return None
        return int(index), bytes(state)

    def forget_received(self) -> None:
        """The state machine installed it (and keeps its own copy)."""
        self.received_path.unlink(missing_ok=True)


def dump_path(data_dir: Path) -> Path:
    return data_dir / "log-start.dump"


def finish_interrupted_reset(commitlog: CommitLog, data_dir: Path) -> None:
    """At start, before anything reads ``commitlog``: a crash between a log reset and its
    first two appends leaves an empty log waiting for its start entry; they are still in
    the received dump file. Raises ConfigError when they are not."""
    awaiting = commitlog.awaiting_start
    if not awaiting:
        return
    try:
        start = decode_log_start(dump_path(data_dir).read_bytes())
        first, second = start.first, start.second
    except (OSError, ValueError):
        first = second = None
    if first is None or second is None or first.index != awaiting:
        raise ConfigError(
            f"{data_dir / 'commitlog'}: the log was restarted at index {awaiting} but the entries "
            "that start it are missing; move this node's data directory away so it is "
            "re-fetched from its peers")
    for entry in (first, second):
        kind, body = decode_command(entry.command)
        position = commitlog.append(entry.index, entry.term, kind, body)
        if position != entry.position:
            raise ConfigError(f"log restart at {entry.index}: position {position} is not "
                              f"the leader's {entry.position}")
    commitlog.flush()
    log.warning("finished an interrupted log restart at index %d", awaiting)
