"""The pysyncobj journal backed by the CommitLog, and where its defects are neutralised.

pysyncobj creates its log through ``createJournal(conf.journalFile)`` and speaks
to it through the ``pysyncobj.journal.Journal`` contract: ``add``, ``clear``,
``deleteEntriesFrom``/``deleteEntriesTo`` (positions relative to the first held
entry), ``__getitem__`` (ints and slices of ``(command, index, term)``),
``__len__``, commit index, term and vote. ``RaftJournal`` implements that
contract over ``CommitLog`` and is the one place where Raft's persistence rules
are enforced:

* **Durability.** Entries are appended to the segment files; ``flush()`` fsyncs
  them. Under flush policy ``sync`` the node's transport calls ``flush()`` before
  any message leaves the node (so a follower's ack and a leader's replication of
  an entry both follow its fsync; many entries added in one tick share one fsync
  -- group commit), and the node calls it before acknowledging a proposal.
  Term and vote are written in place and fsynced (``dledger.storage.hard_state``) before
  ``setCurrentTerm`` returns, i.e. before pysyncobj answers a vote -- also on a full disk.

* **A full disk refuses, it does not fail half-way.** An ``add`` whose append fails for
  want of space (``dledger.storage.disk_guard``) appends nothing, raises the disk-full flag, tells
  ``on_not_stored(command)`` and raises ``EntryNotStored``, which the node catches where
  pysyncobj called it: a leader answers that proposal ``DiskFull``, a follower rejects
  the append so that the leader resends it later (``dledger.raft.transport``).

* **No matching entry is ever deleted** (defect 1: a stale ``prevLogIdx`` after a
  nextIndex regression made stock pysyncobj delete matching, even committed,
  entries). ``deleteEntriesFrom`` is only called by a follower after the
  consistency check at ``prevLogIdx`` passed; the journal records that index as
  *confirmed* and deletes nothing. Each following ``add`` applies Raft's rule
  (§5.3): an entry already held with the same term is skipped, one held with a
  different term is a conflict and truncates the log from there. A conflict at
  or below the committed index is impossible in Raft and raises instead of
  destroying committed data.

* **Committed means confirmed.** pysyncobj's follower sets its commit index to
  ``min(leaderCommit, lastLogIndex)``, which with a kept stale tail could name
  entries the leader never had. The journal therefore exposes
  ``committed_index = min(raft commit, confirmed)``, where *confirmed* is the
  highest index known to match the current term's leader (every ``add`` in this
  term, every passed consistency check; reset to the committed index when the
  term changes). Readers and the state machine use only ``committed_index``; it
  never moves backwards.

Threads: pysyncobj's tick thread calls every contract method; other threads may
call ``committed_index``, ``read_committed`` and ``flush`` concurrently. How entries are
read back as pysyncobj's tuples (lazily, the newest from memory): ``journal_entries``.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from pysyncobj.journal import Journal

from dledger.latency import LatencyHistogram
from dledger.raft.codec import decode_command
from dledger.raft.journal_entries import LazyEntries, tuple_at
from dledger.stage_clock import StageClock
from dledger.storage.commitlog import CommitLog, LogGap
from dledger.storage.disk_guard import DiskGuard
from dledger.storage.entry_format import Entry, EntryKind
from dledger.storage.hard_state import HardState, HardStateFile

__all__ = ["CommittedEntryConflict", "EntryNotStored", "LogGap", "RaftJournal"]

log = logging.getLogger("dledger.journal")

#: The newest entries are also kept as pysyncobj tuples in memory, so that
#: replicating them to followers reads no disk and re-encodes nothing (``journal_entries``).
RECENT_CACHE_BYTES = 16 << 20


class CommittedEntryConflict(RuntimeError):
    """A leader tried to overwrite a committed entry: refused, data kept."""


class EntryNotStored(Exception):
    """The disk could not take entry ``index``: nothing of it was appended (the journal's
    ``disk`` flag is up). Raised through pysyncobj to the node, which answers for it."""

    def __init__(self, index: int, error: OSError) -> None:
        super().__init__(f"entry {index} not stored: {error}")
        self.index = index


class RaftJournal(Journal):
    """pysyncobj journal over a CommitLog; see the module docstring for the rules."""

    def __init__(self, commitlog: CommitLog, state_path: Path, disk: DiskGuard | None = None) -> None:
        """``state_path``: the hard state file (term, vote, commit hint); ``disk``: the flag
        a full disk raises (default: one of its own, resuming at 64 MiB free)."""
        self._log = commitlog
        self._hard = HardStateFile(state_path)
        self.disk = disk if disk is not None else DiskGuard(state_path.parent, 64 << 20)
        self._lock = threading.Lock()
        state = self._hard.state
        self._term: int = max(state.term, commitlog.last_term)
        self._voted_for: str | None = state.voted_for
        stored_commit = min(state.commit, commitlog.last_index)
        # The first held entry is committed: index 1 is the no-op every node
        # writes itself, and a later first entry is a retained or reset start.
        stored_commit = max(stored_commit, commitlog.first_index)
        self._committed = stored_commit
        self._confirmed = stored_commit
        self._raft_commit = stored_commit
        self._persisted_commit = stored_commit
        self._commit_listeners: list[Any] = []
        self.last_fsync_time: float | None = None
        self.fsync_seconds = LatencyHistogram()  # every flush that synced (/metrics)
        self.stages = StageClock()  # where an entry's commit time goes (/metrics, /stages)
        self.skipped_deletes = 0
        self.conflict_truncations = 0
        self._closed = False
        self._recent: dict[int, tuple[bytes, int, int]] = {}  # never replaced: LazyEntries hold it
        self._recent_bytes = 0
        self._staged_reset: tuple[int, int] | None = None
        self.log_resets: list[tuple[int, int]] = []  # (first, last) index ranges never received
        #: Told of every RAFT-kind entry appended (membership changes) and of every
        #: truncation: ``on_raft_entry(index, command)``, ``on_truncate(first_removed)``.
        self.on_raft_entry: Any = None
        self.on_truncate: Any = None
        #: Told when a deleteEntriesFrom was skipped (pysyncobj undid the membership changes
        #: of the entries kept): ``on_kept_tail()``.
        self.on_kept_tail: Any = None
        #: Told of an entry the disk could not take (before EntryNotStored is raised):
        #: ``on_not_stored(command)`` -- the very bytes object pysyncobj passed to ``add``.
        self.on_not_stored: Any = None
        #: Told, before a snapshot install drops them, that the log holds entries at or beyond
        #: the reset index (this replica was not behind): ``on_forgetting(why)``.
        self.on_forgetting: Any = None

    # -- pysyncobj contract --------------------------------------------------
    def add(self, command: bytes, idx: int, term: int) -> None:
        last = self._log.last_index
        if len(self._log) == 0 or idx == last + 1:
            self._append(command, idx, term)
        elif idx > last + 1:
            raise RuntimeError(f"journal gap: add of index {idx} after last index {last}")
        elif idx < self._log.first_index or self._log.term_at(idx) == term:
            pass  # already held (Raft §5.3: skip entries that match)
        else:
            self._truncate_conflict(idx, term)
            self._append(command, idx, term)
        self._confirm(idx)

    def _append(self, command: bytes, idx: int, term: int) -> None:
        began = self.stages.clock()
        kind, body = decode_command(command)
        try:
            self._log.append(idx, term, kind, body)
        except OSError as e:
            if not self.disk.note(f"appending entry {idx} to the CommitLog", e):
                raise
            if self.on_not_stored is not None:
                self.on_not_stored(command)
            raise EntryNotStored(idx, e) from e
        if kind == EntryKind.RAFT and self.on_raft_entry is not None:
            self.on_raft_entry(idx, body)
        self._recent[idx] = (command, idx, term)
        self.stages.appended(idx, command, began)
        self._recent_bytes += len(command)
        while self._recent_bytes > RECENT_CACHE_BYTES:
            oldest = next(iter(self._recent))
            self._recent_bytes -= len(self._recent.pop(oldest)[0])

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        prev_index = self._log.first_index + entryFrom - 1
        self._confirm(prev_index)
        self.skipped_deletes += 1
        if self.on_kept_tail is not None and prev_index < self._log.last_index:
            self.on_kept_tail()
        log.debug("kept entries after %d (stale prevLogIdx); conflicts resolve at add", prev_index)

    def deleteEntriesTo(self, entryTo: int) -> None:
        # Only log compaction calls this, and compaction is switched off.
        raise RuntimeError("log compaction is disabled for RaftJournal")

    def clear(self) -> None:
        """pysyncobj's snapshot install: restart the log at the leader's retained start.

        Meant for a follower behind the leader's first retained entry (log compaction is
        off); ``stage_reset`` must have described that start. A log that holds the reset
        index or beyond is reset too -- kept, pysyncobj would still answer the leader that it
        holds the log's end, unchecked -- after ``on_forgetting`` made it a new storage.
        """
        start = self._staged_reset
        if start is None:
            raise RuntimeError("journal clear without a staged log start")
        self._staged_reset = None
        index, position = start
        before, held = self._committed, self._log.last_index
        if held >= index:  # not behind the retained start: entries it acknowledged may go
            log.warning("snapshot install at index %d over a log holding entries up to %d: the log "
                        "restarts anyway (pysyncobj answers for the installed start) and this replica "
                        "becomes a new storage", index, held)
            if self.on_forgetting is not None:
                self.on_forgetting(f"a snapshot install restarted its log at index {index} over "
                                   f"entries it held up to {held}")
        self._log.reset(index, position)
        self._recent.clear()
        self._recent_bytes = 0
        with self._lock:
            self._committed = max(self._committed, index)
            self._confirmed = index
        if before + 1 < index:  # entries never received (none when it held past the start)
            self.log_resets.append((before + 1, index - 1))
            log.error("log restarted at index %d, position %d: entries %d..%d were deleted by "
                      "retention on the leader before this node received them",
                      index, position, before + 1, index - 1)

    def stage_reset(self, index: int, position: int) -> None:
        """Announce where the next ``clear()`` restarts the log (from the leader's dump)."""
        self._staged_reset = (index, position)

    def __getitem__(self, item: int | slice) -> Any:
        first, n = self._log.first_index, len(self._log)
        if isinstance(item, slice):
            lo, hi, step = item.indices(n)
            if step != 1:
                raise ValueError("RaftJournal slices must have step 1")
            return LazyEntries(self._log, self._recent, first + lo, first + max(lo, hi))
        if item < 0:
            item += n
        if not 0 <= item < n:
            raise IndexError(item)
        return tuple_at(self._log, self._recent, first + item)

    def __len__(self) -> int:
        return len(self._log)

    def _destroy(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.flush()
        self._persist_commit()
        self._log.close()
        self._hard.close()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        self._raft_commit = raftCommitIndex
        self._advance_committed()

    def getRaftCommitIndex(self) -> int:
        return self._committed

    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:
        if term != self._term:
            with self._lock:
                self._confirmed = self._committed
        self._term, self._voted_for = term, votedForNodeId
        self._write_state()

    def getCurrentTerm(self) -> int:
        return self._term

    def getVotedForNodeId(self) -> str | None:
        return self._voted_for

    def onOneSecondTimer(self) -> None:
        self._persist_commit()

    # -- RaftMQ interface ----------------------------------------------------
    @property
    def commitlog(self) -> CommitLog:
        return self._log

    @property
    def committed_index(self) -> int:
        """Highest index known committed on this node; never decreases."""
        return self._committed

    @property
    def confirmed_index(self) -> int:
        return self._confirmed

    @property
    def resume_hint(self) -> int:
        """Where a rejecting follower asks the leader to resume: after what is known to match."""
        return max(self._confirmed, self._log.first_index) + 1

    def add_commit_listener(self, listener: Any) -> None:
        """``listener(committed_index)`` runs on the tick thread after each advance."""
        self._commit_listeners.append(listener)

    def read_committed(self, from_index: int, max_bytes: int) -> list[Entry]:
        """Committed entries from ``from_index`` (at least one if available).

        Raises ``LogGap`` when ``from_index`` is below the first retained entry.
        """
        return self._log.committed_entries(from_index, max_bytes, self._committed)

    def flush(self) -> bool:
        """fsync what was appended since the last flush; True if anything was synced."""
        if not self._log.dirty:
            return False
        began = time.monotonic()
        upto = self._log.last_index
        synced = self._log.flush()
        if synced:
            self.fsync_seconds.observe(time.monotonic() - began)
            self.last_fsync_time = time.time()
            self.stages.synced(upto)
        return synced

    # -- internals -------------------------------------------------------------
    def _confirm(self, index: int) -> None:
        with self._lock:
            if index > self._confirmed:
                self._confirmed = min(index, self._log.last_index)
        self._advance_committed()

    def _advance_committed(self) -> None:
        with self._lock:
            target = min(self._raft_commit, self._confirmed, self._log.last_index)
            if target <= self._committed:
                return
            self._committed = target
        self.stages.committed(target)
        for listener in self._commit_listeners:
            listener(target)

    def _truncate_conflict(self, idx: int, term: int) -> None:
        held = self._log.term_at(idx)
        if idx <= self._committed:
            log.critical(
                "refusing to overwrite committed entry %d (term %d) with term %d; "
                "committed index %d", idx, held, term, self._committed)
            raise CommittedEntryConflict(f"entry {idx} is committed")
        log.warning("conflict at index %d (held term %d, leader term %d): truncating %d entries",
                    idx, held, term, self._log.last_index - idx + 1)
        self.conflict_truncations += 1
        with self._lock:
            self._confirmed = min(self._confirmed, idx - 1)
        self._log.truncate_from(idx)
        if self.on_truncate is not None:
            self.on_truncate(idx)
        for stale in [i for i in self._recent if i >= idx]:
            self._recent_bytes -= len(self._recent.pop(stale)[0])

    def _write_state(self) -> None:
        self._hard.save(HardState(self._term, self._voted_for, self._persisted_commit))

    def _persist_commit(self) -> None:
        """Store the committed index (a restart hint) once the log under it is on disk."""
        committed = self._committed
        if committed == self._persisted_commit:
            return
        try:
            self.flush()
        except OSError as e:
            if not self.disk.note("flushing the CommitLog for the commit hint", e):
                raise
            return  # a hint: stored at a later tick
        self._persisted_commit = committed
        self._write_state()



def silence_false_truncation_alarm() -> None:
    """Drop two pysyncobj log lines that do not describe what happens here.

    "truncating already-applied log entries" is logged before ``deleteEntriesFrom``,
    which RaftJournal turns into a no-op (a real conflict truncation is a WARNING
    from ``dledger.raft.journal``). "Failed to open file for transmission" repeats on
    every heartbeat for a follower behind the retained start; ReplicatedLog
    reports that follower instead (ERROR, once, and in ``status()``).
    """

    class _Filter(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            message = record.getMessage()
            return ("truncating already-applied" not in message
                    and "Failed to open file for transmission" not in message)

    for name in ("pysyncobj.syncobj", "pysyncobj.serializer"):
        logging.getLogger(name).addFilter(_Filter())
