"""ReplicatedLog: the one interface the broker uses to reach the Raft CommitLog.

    propose(payload) -> Future[Appended]   leader only; resolves once committed
    read(from_index, max_bytes)            committed entries only, any replica
    committed_index / wait_committed()     what may be served or applied
    status()                               role, term, leader, indexes, fsync time
    add_leader_listener(fn)                leadership changes
    change_membership(change)              add or remove one replica (leader only)

Behind it: a pysyncobj ``SyncObj`` whose journal is ``RaftJournal`` over the
segmented ``CommitLog`` (installed through pysyncobj's ``createJournal`` name),
whose transport is ``GroupTransport`` (flush before send, conflict hints) and
whose peers are ``PeerNode`` (dialable through a proxy). Configuration closes
the remaining defects: log compaction is off (no snapshot install, so no holes
after catch-up -- a lagging follower is fed from the log itself), every entry is
below ``MAX_ENTRY_BYTES`` which is far below ``appendEntriesBatchSizeBytes`` (no
chunked transmission), and ``leaderFallbackTimeout`` is the leader lease (an
isolated leader steps down after ``leader_lease_ms``, default 2 s).

A full disk (``dledger.disk_guard``): a replica whose disk cannot take an entry does not
stand for election until ``disk_resume_free_bytes`` are free again; a leader hands the
leadership to a member with room and refuses proposals with ``DiskFull`` naming itself;
a follower refuses the entries it cannot store and says so in every answer, so the
leader keeps its lease (no elections) and refuses proposals with ``DiskFull`` naming
the full members while a majority cannot store. Entries resume by themselves.

Threads: pysyncobj's tick thread runs Raft, appends and commit callbacks;
``propose``/``read``/``status`` may be called from any thread.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import enum
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj import syncobj as _syncobj_module
from pysyncobj.config import FAIL_REASON
from pysyncobj.pipe_notifier import PipeNotifier

from dledger.commitlog import CommitLog
from dledger.config import (
    APPEND_BATCH_BYTES,
    MAX_ENTRY_BYTES,
    ConfigError,
    FlushPolicy,
    GroupConfig,
)
from dledger.disk_guard import DiskGuard
from dledger.durable_file import atomic_write
from dledger.entry_format import Entry
from dledger.errors import (
    EntryTooLarge,
    NoLeader,
    NotLeader,
    OutcomeUnknown,
    ProposalRejected,
    ProposeError,
)
from dledger.full_disks import FollowerDisks, own_disk_full, refusal
from dledger.journal import EntryNotStored, RaftJournal, silence_false_truncation_alarm
from dledger.latency import LatencyHistogram
from dledger.log_start import DumpEntry, decode_log_start, encode_log_start
from dledger.membership import MEMBERSHIP_PREFIX, Change, Member, MemberHistory, decode_change, encode_change
from dledger.peer_crypto import install_peer_crypto
from dledger.prevote import PreVote
from dledger.raft_codec import (
    APPEND_FUNC_ID,
    decode_command,
    encode_payload_command,
    install_wire_codec,
)
from dledger.retention import RetentionPlan, plan_retention
from dledger.snapshot_fetch import SnapshotFetch
from dledger.transport import PeerNode, make_transport_class

__all__ = ["NOT_A_MEMBER", "Appended", "LeaderChange", "ReplicatedLog", "Role", "SnapshotSource"]

#: More proposed bytes in flight than this: appends are batched per heartbeat.
BATCH_ABOVE_BYTES = 128 * 1024

log = logging.getLogger("dledger.replicated_log")

_NEVER = 2**62  # log compaction thresholds: never compact
NOT_A_MEMBER = "this replica is not a voting member of the group"
#: A member that does not stand (its state is wrong, or waits for a snapshot) still holds
#: the log: it may hold committed entries no other reachable member has, and then no
#: other member can win an election (their logs are older). After this many maximum
#: election timeouts without a leader it stands -- only to hand the leadership over.
HANDOVER_AFTER_TIMEOUTS = 3
MEMBER_VIEW_CHECK_S = 1.0
#: Why a replica whose disk is full does not stand (``stand_for_election``'s reason).
DISK_FULL = "its disk is full"
DISK_CHECK_S = 1.0  # how often the disk's free space is looked at
TRANSFER_NOT_TAKEN_S = 30.0  # a member that did not take a transfer is passed over this long
SOCKET_BUFFER_BYTES = 4 << 20  # fewer, larger socket writes (the kernel may clamp it)


class Role(enum.StrEnum):
    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    LEADER = "leader"


_ROLE_OF_STATE = {0: Role.FOLLOWER, 1: Role.CANDIDATE, 2: Role.LEADER}


@dataclass(frozen=True, slots=True)
class Appended:
    """Where a committed proposal landed: the same on every replica."""

    index: int
    term: int
    position: int


@dataclass(frozen=True, slots=True)
class LeaderChange:
    role: Role
    term: int
    leader: str | None


# -- journal injection ----------------------------------------------------------
_pending_journals: dict[str, RaftJournal] = {}
_stock_create_journal = _syncobj_module.createJournal


def _create_journal(journal_file: Any) -> Any:
    journal = _pending_journals.pop(journal_file, None) if journal_file else None
    return journal if journal is not None else _stock_create_journal(journal_file)


_syncobj_module.createJournal = _create_journal


class SnapshotSource(Protocol):
    """A state machine's snapshots: the state after an index, as bytes it can install."""

    def snapshot_indexes(self) -> list[int]: ...
    def snapshot_bytes(self, index: int) -> bytes | None: ...
    def prune_snapshots_below(self, index: int) -> None: ...
    def oldest_held_position(self) -> int | None:
        """The lowest CommitLog position the state still reads later (a held message)."""


class _GroupConf(SyncObjConf):
    """pysyncobj's conf; its check sees the election timeouts of a node that stands, while
    a node that must not stand (``stand_for_election``) starts with them out of reach."""

    standing_timeouts: tuple[float, float] | None = None

    def validate(self) -> None:
        held = self.raftMinTimeout, self.raftMaxTimeout
        if self.standing_timeouts is not None:
            self.raftMinTimeout, self.raftMaxTimeout = self.standing_timeouts
        try:
            super().validate()
        finally:
            self.raftMinTimeout, self.raftMaxTimeout = held


class _RaftNode(SyncObj):
    """The pysyncobj object; its only replicated method marks DATA entries."""

    @replicated
    def _append(self, payload: bytes) -> int:
        # pysyncobj applies entry i with raftLastApplied == i - 1 and increments
        # it afterwards; the return value reaches the proposer's callback.
        return self.raftLastApplied + 1

    def _checkCommandsToApply(self) -> None:
        """pysyncobj's leader loop over queued proposals (a protected member, 0.3.17): a
        proposal the disk could not take was answered by the journal's ``on_not_stored``
        and is gone from the queue; the loop goes on with the next one instead of ending
        the tick."""
        for _ in range(_REFUSALS_PER_TICK):
            try:
                super()._checkCommandsToApply()
                return
            except EntryNotStored:
                continue


_REFUSALS_PER_TICK = 1000


def _check_bindable(address: str) -> None:
    host, port = address.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, int(port)))
        except OSError as e:
            raise ConfigError(f"cannot listen on Raft address {address}: {e.strerror}") from None


class ReplicatedLog:
    """One replica of a group's CommitLog (see module docstring)."""

    def __init__(self, config: GroupConfig) -> None:
        install_wire_codec()
        install_peer_crypto()
        silence_false_truncation_alarm()
        self.config = config
        _check_bindable(config.address)
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self._not_standing: set[str] = set()  # why this node must not become a candidate
        self._paused_until = 0.0  # proposals refused while the leadership moves
        self._transfer_to: PeerNode | None = None  # handed to pysyncobj on the tick thread
        self._started = time.monotonic()
        self._led_at = 0.0  # when this replica last led (for the hand-over rule)
        self._handing_over = False  # standing only to hand over (see HANDOVER_AFTER_TIMEOUTS)
        self._hand_over_thread: threading.Thread | None = None
        self._hand_over_lock = threading.Lock()
        self.commitlog_dir = config.data_dir / "commitlog"
        self.commitlog = CommitLog(self.commitlog_dir, config.segment_bytes,
                                   repair=config.repair_log)
        self._dump_path = config.data_dir / "log-start.dump"
        self._received_path = config.data_dir / "received-snapshot"
        self._snapshots: SnapshotSource | None = None
        self._finish_interrupted_reset()
        initial = {name: Member(name, addr) for name, addr in config.peers.items()
                   if not (config.join and name == config.node)}
        self._history = MemberHistory(config.data_dir / "members", initial, self.commitlog.last_index)
        self._learner = not self.is_member
        if self._learner:  # before pysyncobj draws its first election deadline
            self._not_standing.add(NOT_A_MEMBER)
        self._startup_dump = True  # pysyncobj loads our own dump file at its first tick
        self._reintroduce = False
        self._change_lock = threading.Lock()
        self._next_view_check = 0.0
        self._members_dirty = False
        self.disk = DiskGuard(config.data_dir, config.disk_resume_free_bytes)
        self._follower_disks = FollowerDisks()  # on a leader: what each follower last said
        self._next_disk_check = 0.0
        self._transfer_refused_at = -1e9
        self._not_taken: dict[str, float] = {}  # member -> when a transfer to it timed out
        self.journal = RaftJournal(self.commitlog, config.data_dir / "raft-state", self.disk)
        self.journal.on_raft_entry = self._on_raft_entry
        self.journal.on_truncate = self._on_truncate
        self.journal.on_kept_tail = self._mark_members_dirty
        self.journal.on_not_stored = self._on_not_stored
        self._commit_cond = threading.Condition()
        self.journal.add_commit_listener(self._on_commit)
        self._listeners: list[Callable[[LeaderChange], None]] = []
        self._last_change: LeaderChange | None = None
        self._in_flight: dict[concurrent.futures.Future[Appended], int] = {}  # -> payload bytes
        #: id of a proposal's command bytes -> (those bytes, its future), until it is answered
        self._commands: dict[int, tuple[bytes, concurrent.futures.Future[Appended]]] = {}
        self._in_flight_bytes = 0
        self._in_flight_lock = threading.Lock()
        self._closed = threading.Event()
        sync = config.flush == FlushPolicy.SYNC
        transport = make_transport_class(self.journal.flush if sync else None,
                                         lambda: self.journal.resume_hint, lambda: self._learner,
                                         self._set_transport, disk_full=lambda: self.disk.full,
                                         follower_full=self._follower_full)
        self._transport: Any = None
        journal_key = str(config.data_dir / "commitlog")
        self._dump_path.unlink(missing_ok=True)  # rewritten from the log as it is now
        self._write_log_start()
        _pending_journals[journal_key] = self.journal
        others = [self._peer_node(m) for m in self.members().values() if m.raft != config.address]
        self._conf = self._syncobj_conf(journal_key)
        self._node = _RaftNode(PeerNode(config.address, name=config.node), others, self._conf,
                               nodeClass=self._node_of_member_id, transportClass=transport)
        if self._node._methodToID.get("_append_v0", APPEND_FUNC_ID) != APPEND_FUNC_ID:
            raise RuntimeError("pysyncobj numbered the append method unexpectedly")
        self._wakeup = PipeNotifier(self._node._poller)
        self._applied_floor: Callable[[], int] = lambda: self.committed_index
        self._next_retention = time.monotonic() + config.retention_check_s
        self._behind_reported: set[str] = set()
        self._attach_to_ticks()
        if self._learner:
            log.warning("%s is not a member of group %s yet: it catches up as a learner (no vote, "
                        "no candidacy) until a member adds it (raftmq replica add)",
                        config.node, config.group)
            self.stand_for_election(False, NOT_A_MEMBER)
        self._flusher: threading.Thread | None = None
        if not sync:
            self._flusher = threading.Thread(target=self._flush_loop, name="dledger-flush",
                                             daemon=True)
            self._flusher.start()

    def _attach_to_ticks(self) -> None:
        """What runs on pysyncobj's tick thread besides Raft: leadership events, pre-vote,
        snapshot transfers (both on pysyncobj's peer connections), membership, retention."""
        self._prevote = PreVote(self._node, lambda: self.config.election_timeout_ms[0] / 1000,
                                lambda: (self._conf.raftMinTimeout, self._conf.raftMaxTimeout))
        self._fetch = SnapshotFetch(
            self.config.data_dir, members=lambda: list(self._node._SyncObj__otherNodes),
            leader=self._node._getLeader, send=lambda node, m: self._transport.send(node, m),
            snapshot_bytes=lambda i: self._snapshots.snapshot_bytes(i) if self._snapshots else None,
            done=lambda index, data: atomic_write(self._received_path, msgpack.packb([index, data])))
        self._transport.intercept = (
            lambda node, m: self._note_follower_disk(node, m) or self._refuse_transfer(m)
            or self._prevote.on_message(node, m) or self._fetch.on_message(node, m))
        for tick in (self._watch_disk, self._watch_leadership, self._prevote.tick, self._fetch.tick,
                     self._watch_membership, self._retention_tick):
            self._node.addOnTickCallback(tick)

    def _syncobj_conf(self, journal_key: str) -> SyncObjConf:
        c = self.config
        lo, hi = (t / 1000 for t in c.election_timeout_ms)
        conf = _GroupConf(
            journalFile=journal_key,
            password=c.secret or None,
            bindAddress=c.address,
            autoTickPeriod=0.01,
            # False at start so pysyncobj creates its pipe notifier; _adapt_batching flips it
            appendEntriesUseBatch=False,
            appendEntriesPeriod=c.heartbeat_ms / 1000,
            appendEntriesBatchSizeBytes=APPEND_BATCH_BYTES,
            raftMinTimeout=lo,
            raftMaxTimeout=hi,
            leaderFallbackTimeout=c.leader_lease_ms / 1000,
            connectionTimeout=max(c.election_timeout_ms[1] / 1000 * 2, 2.0),
            connectionRetryTime=c.connect_retry_ms / 1000,
            logCompactionMinEntries=_NEVER,
            logCompactionMinTime=_NEVER,
            dynamicMembershipChange=True,
            commandsWaitLeader=False,
            fullDumpFile=str(self._dump_path),
            serializer=self._refuse_serialize,
            deserializer=self._read_log_start,
            useFork=False,
            sendBufferSize=SOCKET_BUFFER_BYTES,
            recvBufferSize=SOCKET_BUFFER_BYTES,
        )
        conf.standing_timeouts = (lo, hi)
        if self._not_standing:  # before pysyncobj draws its first election deadline
            conf.raftMinTimeout = conf.raftMaxTimeout = 1e9
        return conf

    # -- writing ---------------------------------------------------------------
    def propose(self, payload: bytes) -> concurrent.futures.Future[Appended]:
        """Append ``payload`` as one DATA entry; the future resolves once committed.

        Raises ``EntryTooLarge`` at once; the future fails with ``NotLeader``,
        ``NoLeader``, ``ProposalRejected``, ``DiskFull`` (definitely not committed) or
        ``OutcomeUnknown`` (may have committed).
        """
        if len(payload) > MAX_ENTRY_BYTES:
            raise EntryTooLarge(
                f"entry payload is {len(payload)} bytes; the limit is {MAX_ENTRY_BYTES}")
        future: concurrent.futures.Future[Appended] = concurrent.futures.Future()
        if not self.is_leader:
            future.set_exception(self._not_leader())
            return future
        refused = refusal(self.config.node, self.config.group, self.disk, self.disk_full_nodes(),
                          len(self.members()))
        if refused is not None:
            future.set_exception(refused)
            return future
        if time.monotonic() < self._paused_until or self._not_standing:
            future.set_exception(NoLeader("leadership is being transferred; retry shortly"))
            return future
        command = encode_payload_command(payload)
        with self._in_flight_lock:
            self._in_flight[future] = len(payload)
            self._in_flight_bytes += len(payload)
            self._commands[id(command)] = (command, future)
            self._adapt_batching()
        future.add_done_callback(lambda f: self._forget_proposal(f, id(command)))
        self._node._applyCommand(command, lambda res, err: self._on_proposal_done(future, res, err))
        with contextlib.suppress(BlockingIOError):  # a full pipe: the tick thread is awake
            self._wakeup.notify()
        return future

    def _forget_proposal(self, future: concurrent.futures.Future[Appended], command_id: int) -> None:
        with self._in_flight_lock:
            self._in_flight_bytes -= self._in_flight.pop(future, 0)
            held = self._commands.get(command_id)
            if held is not None and held[1] is future:
                del self._commands[command_id]
            self._adapt_batching()

    def _adapt_batching(self) -> None:
        """Little in flight: pysyncobj sends each proposal at once and wakes its tick thread
        (low latency). Much: it batches appends per heartbeat (throughput). Measured on 2
        cores: one in flight commits in 2.4 ms instead of 12.8 ms, while 32 in flight of
        30 KiB reach ~1,350 entries/s instead of 610 (docs/BENCHMARKS.md). pysyncobj reads
        ``appendEntriesUseBatch`` from our conf object at each use (0.3.17, pinned)."""
        self._conf.appendEntriesUseBatch = self._in_flight_bytes > BATCH_ABOVE_BYTES

    def _fail_in_flight(self) -> None:
        """Leadership was lost: pysyncobj will never call these proposals back, so answer
        them now. They may still commit under the next leader: OutcomeUnknown."""
        with self._in_flight_lock:
            pending, self._in_flight = list(self._in_flight), {}
            self._in_flight_bytes = 0
            self._adapt_batching()
        for future in pending:
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                future.set_exception(OutcomeUnknown(
                    "this node lost the leadership before the entry committed; it may still commit"))

    def _on_proposal_done(self, future: concurrent.futures.Future[Appended],
                          index: Any, err: int) -> None:
        if future.done():  # answered when the leadership was lost
            return
        if err == FAIL_REASON.SUCCESS:
            self.journal.flush()  # a one-node group acks here; otherwise a no-op
            appended = Appended(index, self.commitlog.term_at(index),
                                self.commitlog.position_of(index))
            future.set_result(appended)
            return
        future.set_exception(self._propose_error(err))

    def _propose_error(self, err: int) -> ProposeError:
        if err in (FAIL_REASON.LEADER_CHANGED, FAIL_REASON.UNKNOWN_OUTCOME):
            return OutcomeUnknown(f"leadership changed before the entry committed (code {err})")
        if err == FAIL_REASON.DISCARDED:
            return ProposalRejected("a new leader replaced the entry; it was not committed")
        if err in (FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER):
            return self._not_leader()
        return ProposalRejected(f"proposal refused by the leader (code {err})")

    def _not_leader(self) -> ProposeError:
        leader = self.leader
        if leader is None:
            return NoLeader("the group has no leader right now; retry shortly")
        member = self.members().get(leader)
        return NotLeader(leader, member.raft if member else "")

    # -- a full disk (dledger.disk_guard, dledger.full_disks) -------------------------------
    def disk_full_nodes(self) -> list[str]:
        """Members whose disks are full: this replica, and on a leader the followers whose
        last answer said so. Any thread."""
        full = {self.config.node} if self.disk.full else set()
        if self.is_leader:
            full |= self._follower_disks.full_among(self.members())
        return sorted(full)

    def _on_not_stored(self, command: bytes) -> None:
        """Journal hook (tick thread): the disk could not take ``command``. If it is this
        leader's own proposal, it was never appended: answered DiskFull (not committed)."""
        self._members_dirty = True  # pysyncobj stopped in the middle of its handler
        with self._in_flight_lock:
            held = self._commands.get(id(command))
        if held is not None and held[0] is command:
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                held[1].set_exception(own_disk_full(self.config.node, self.config.group, self.disk))

    def _follower_full(self, node: Any) -> bool:
        """Transport (tick thread): whether follower ``node`` last said its disk is full."""
        return self._follower_disks.is_full(getattr(node, "name", ""))

    def _note_follower_disk(self, node: Any, message: dict[str, Any]) -> bool:
        """Transport intercept (tick thread): every answer of a follower to an append says
        whether its disk is full (``dledger.transport``). Consumes nothing."""
        if message.get("type") == "next_node_idx":
            name = getattr(node, "name", "") or self._address_names().get(getattr(node, "address", ""))
            if name:  # else a learner (read-only peer): it does not count for a majority
                self._follower_disks.heard(name, bool(message.get("disk_full")))
        return False

    def _watch_disk(self) -> None:
        """Tick: no candidacy while the disk is full; look for free space about once a second."""
        now = time.monotonic()
        if now >= self._next_disk_check:  # lowers the flag when there is room, raises it when
            self._next_disk_check = now + DISK_CHECK_S  # not even one entry fits
            self.disk.check()
        full = self.disk.full
        if full != (DISK_FULL in self._not_standing):
            self.stand_for_election(not full, DISK_FULL)

    # -- reading ---------------------------------------------------------------
    @property
    def committed_index(self) -> int:
        return self.journal.committed_index

    def read(self, from_index: int, max_bytes: int = 1 << 20) -> list[Entry]:
        """Committed entries from ``from_index`` (never beyond ``committed_index``).

        Raises ``LogGap`` if retention already deleted ``from_index``.
        """
        return self.journal.read_committed(from_index, max_bytes)

    def wait_committed(self, index: int, timeout: float) -> bool:
        """Block until ``committed_index >= index`` or the timeout; returns whether it is."""
        with self._commit_cond:
            return self._commit_cond.wait_for(lambda: self.committed_index >= index, timeout)

    def _on_commit(self, _committed: int) -> None:
        with self._commit_cond:
            self._commit_cond.notify_all()

    # -- leadership and status -------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return self._node._isLeader()

    @property
    def leader(self) -> str | None:
        node = self._node._getLeader()
        return self._address_names().get(node.address) if node is not None else None

    # -- candidacy: who may start an election, and when --------------------------------
    def stand_for_election(self, allowed: bool, reason: str = "its state is known to be wrong") -> None:
        """Whether this node may become a candidate for ``reason`` (it always votes): a replica
        whose state is wrong or behind what it can apply must not lead. It stands again once
        no reason is left. A member (not a learner) that must not lead still stands when the
        group has had no leader for ``HANDOVER_AFTER_TIMEOUTS`` election timeouts -- its log
        may be the only one a majority accepts -- and then hands the leadership to the most
        caught-up member at once, accepting no proposal meanwhile."""
        if allowed:
            if reason in self._not_standing:
                self._not_standing.discard(reason)
                log.info("this node may stand for election again (%s is over)", reason)
        elif reason not in self._not_standing:
            self._not_standing.add(reason)
            log.log(logging.INFO if reason == NOT_A_MEMBER else logging.ERROR,
                    "this node no longer stands for election: %s", reason)
            if self.is_leader:
                self._start_hand_over()
        self._apply_candidacy()

    def _apply_candidacy(self) -> None:
        """Set the election timeouts on our conf object; pysyncobj reads them at each use
        (0.3.17, pinned). pysyncobj never stands while it is connected to no peer; a node
        whose link drops messages while the connection stays up would, but
        ``dledger.prevote`` makes it ask the members first."""
        lo, hi = (t / 1000 for t in self.config.election_timeout_ms)
        if self._not_standing and not self._may_stand_to_hand_over(hi):
            lo = hi = 1e9
        if (self._conf.raftMinTimeout, self._conf.raftMaxTimeout) != (lo, hi):
            self._conf.raftMinTimeout, self._conf.raftMaxTimeout = lo, hi

    def _may_stand_to_hand_over(self, max_timeout_s: float) -> bool:
        if NOT_A_MEMBER in self._not_standing:
            return False
        if self.is_leader:
            self._led_at = time.monotonic()  # a leader hears no appends: it is the one heard
            return True  # the hand-over thread is at work; the timeouts do not matter now
        # pysyncobj's follower keeps naming a dead leader until a vote request arrives
        # (and none comes when this replica refuses the others' pre-votes): what counts is
        # when a leader's append was last heard.
        quiet = time.monotonic() - max(self._started, self._prevote.heard_at, self._led_at)
        leaderless = quiet > HANDOVER_AFTER_TIMEOUTS * max_timeout_s
        if leaderless != self._handing_over:
            self._handing_over = leaderless
            if leaderless:
                log.warning("no leader heard for %.1f s and this replica's log may be the newest: "
                            "standing for election only to hand the leadership over (%s)",
                            quiet, "; ".join(sorted(self._not_standing)))
        return leaderless

    def _refuse_transfer(self, message: dict[str, Any]) -> bool:
        """Tick thread: a leader's TimeoutNow to a replica that must not lead (a full disk, a
        snapshot awaited, a state known wrong) is dropped -- standing now would only hand the
        leadership on again, an extra election. The leader's transfer times out and it picks
        another member."""
        if message.get("type") != "timeout_now" or not self._not_standing:
            return False
        now = time.monotonic()
        if now - self._transfer_refused_at > 10.0:
            log.info("refused a leadership transfer: this replica must not lead (%s)",
                     "; ".join(sorted(self._not_standing)))
        self._transfer_refused_at = now
        return True

    def _start_hand_over(self) -> None:
        with self._hand_over_lock:
            if self._hand_over_thread is not None and self._hand_over_thread.is_alive():
                return
            self._hand_over_thread = threading.Thread(target=self._hand_over, name="dledger-hand-over",
                                                      daemon=True)
            self._hand_over_thread.start()

    def _hand_over(self) -> None:
        """A replica that must not lead leads (it won an election, or was found wrong while
        leading): pass the leadership on as soon as a member has every entry
        (``transfer_leadership`` waits for that)."""
        pause = threading.Event()
        try:
            while self.is_leader and self._not_standing:
                roomy = [n for n, up in self._connected().items()
                         if up and not self._follower_disks.is_full(n)]
                if self._not_standing == {DISK_FULL} and not roomy:
                    pause.wait(0.2)  # every other member's disk is full too: no better leader
                    continue
                if self.transfer_leadership(timeout=5.0) is not None:
                    return
                pause.wait(0.2)  # no member connected, or none caught up within the timeout
        except ProposeError:
            pass  # deposed meanwhile

    # -- leadership transfer (the leader's side) ------------------------------------------
    def transfer_leadership(self, target: str | None = None, timeout: float = 3.0) -> str | None:
        """Leader: hand the leadership to ``target`` (default: the connected member with the
        highest match index, passing over members known full or that did not take a transfer
        in the last ``TRANSFER_NOT_TAKEN_S``) -- pause new proposals (NoLeader, retriable), then on every tick
        offer pysyncobj's ``transferLeadership`` (Raft's TimeoutNow) until it accepts: it
        refuses while the target lacks an entry, and proposals made before the pause may
        still be appended, so the check must be the tick thread's own. Returns the new
        leader, or None if it did not move within ``timeout``. Any thread but the tick thread."""
        if not self.is_leader:
            raise self._not_leader()
        if target is None:
            s = self._raft_status()
            matches = {name: s.get(f"match_idx_server_{addr}", 0)
                       for addr, name in self._address_names().items()
                       if s.get(f"partner_node_status_server_{addr}") == 2}
            roomy = {n: i for n, i in matches.items() if not self._follower_disks.is_full(n)}
            matches = roomy or matches  # a member whose disk is full would hand it on again
            recent = time.monotonic() - TRANSFER_NOT_TAKEN_S
            willing = {n: i for n, i in matches.items() if self._not_taken.get(n, -1e18) < recent}
            matches = willing or matches  # one that did not take it lately (it must not lead)
            if not matches:
                return None
            target = max(matches, key=lambda n: (matches[n], n))
        others = {n: m for n, m in self.members().items() if m.raft != self.config.address}
        if target not in others:
            raise ValueError(f"{target!r} is not another member of this group ({sorted(others)})")
        deadline = time.monotonic() + timeout
        self._paused_until = deadline + 1.0
        try:
            self._transfer_to = self._peer_node(others[target])
            with contextlib.suppress(BlockingIOError):
                self._wakeup.notify()
            while self.is_leader and time.monotonic() < deadline:
                time.sleep(0.001)
            if self.is_leader:
                self._not_taken[target] = time.monotonic()
                return None
            log.info("leadership handed to %s", target)
            while self.leader is None and time.monotonic() < deadline:
                time.sleep(0.001)
            return self.leader
        finally:
            self._transfer_to = None
            self._paused_until = 0.0


    def add_leader_listener(self, listener: Callable[[LeaderChange], None]) -> None:
        """``listener(LeaderChange)`` runs on the tick thread; it must not block."""
        self._listeners.append(listener)

    def _watch_leadership(self) -> None:
        self._apply_candidacy()
        target = self._transfer_to
        if target is not None and self.is_leader:
            answers: list[int] = []
            self._node.transferLeadership(target, lambda _res, err: answers.append(err))
            if answers and answers[0] == FAIL_REASON.SUCCESS:
                self._transfer_to = None  # TimeoutNow sent; the caller waits for the election
                log.info("leadership transfer: TimeoutNow sent to %s", target.address)
            # REQUEST_DENIED: the target lacks an entry yet -- offered again next tick
        status = self._raft_status()
        change = LeaderChange(_ROLE_OF_STATE[status["state"]], status["raft_term"], self.leader)
        if change != self._last_change:
            log.info("%s is now %s in term %d (leader: %s)", self.config.node, change.role.value,
                     change.term, change.leader or "none known")
            if change.role == Role.LEADER and self._not_standing:
                log.warning("leading only to hand over: this replica must not lead (%s)",
                            "; ".join(sorted(self._not_standing)))
                self._start_hand_over()
            was_leader = self._last_change is not None and self._last_change.role == Role.LEADER
            if was_leader and change.role != Role.LEADER:
                self._fail_in_flight()
            self._last_change = change
            for listener in self._listeners:
                listener(change)

    def _connected(self, s: dict[str, Any] | None = None) -> dict[str, bool]:
        """Every other member: whether pysyncobj is connected to it."""
        s = self._raft_status() if s is None else s
        return {name: s.get(f"partner_node_status_server_{addr}") == 2
                for addr, name in self._address_names().items() if addr != self.config.address}

    def status(self) -> dict[str, Any]:
        s = self._raft_status()
        followers = self._follower_indexes("match_idx_server_")
        connected = self._connected(s)
        return {
            "group": self.config.group,
            "node": self.config.node,
            "role": _ROLE_OF_STATE[s["state"]].value,
            "term": s["raft_term"],
            "leader": self.leader,
            "commit_index": self.committed_index,
            "raft_commit_index": s["commit_idx"],
            "first_index": self.commitlog.first_index,
            "last_index": self.commitlog.last_index,
            "write_position": self.commitlog.write_position,
            "follower_match_index": followers if s["state"] == 2 else {},
            "peers_connected": connected,
            "last_fsync_time": self.journal.last_fsync_time,
            "flush": self.config.flush.value,
            "conflict_truncations": self.journal.conflict_truncations,
            "followers_behind_retained_start": self.followers_behind_retained_start(),
            "log_resets": [list(r) for r in self.journal.log_resets],
            "members": {n: {"raft": m.raft, "client": m.client} for n, m in sorted(self.members().items())},
            "member": self.is_member,
            "members_changed_at": self._history.changed_at(),
            "pre_vote_rounds": self._prevote.rounds, "pre_vote_won": self._prevote.won,
            "snapshot_fetch": self._fetch.progress(),
            "disk": self.disk.status(),
            "disk_full_members": self.disk_full_nodes(),
        }

    # -- membership (dledger.membership) ------------------------------------------------
    def members(self) -> dict[str, Member]:
        """The group's voting members, by name, as this replica's log says."""
        return self._history.current()

    @property
    def is_member(self) -> bool:
        return any(m.raft == self.config.address for m in self.members().values())

    @property
    def is_learner(self) -> bool:
        return self._learner

    def _address_names(self) -> dict[str, str]:
        names = {m.raft: name for name, m in self.members().items()}
        names.setdefault(self.config.address, self.config.node)
        return names

    def _peer_node(self, member: Member) -> PeerNode:
        return PeerNode(member.raft, self.config.dial.get(member.name), name=member.name)

    def _node_of_member_id(self, member_id: Any) -> PeerNode:
        """pysyncobj's ``nodeClass``: the node of a member id from a change entry."""
        try:
            return self._peer_node(Member.parse(str(member_id)))
        except ValueError:
            return PeerNode(str(member_id))

    def _set_transport(self, transport: Any) -> None:
        self._transport = transport

    def set_client_addresses(self, clients: dict[str, str]) -> None:
        """Broker addresses of the initial members (their change entries carry the others')."""
        self._initial_clients = dict(clients)

    def client_addresses(self) -> dict[str, str]:
        """name -> broker address of every member."""
        known = getattr(self, "_initial_clients", {})
        out = {n: m.client or known.get(n, "") for n, m in self.members().items()}
        return {n: a for n, a in out.items() if a}

    def _on_raft_entry(self, index: int, command: bytes) -> None:
        """Journal hook (tick thread): a change entry was appended -- it applies now."""
        change = decode_change(command)
        if change is None:
            return
        self._history.record(index, change)
        self._members_dirty = True
        log.info("membership: %s %s (raft %s) at index %d; members now %s",
                 "added" if change.op == "add" else "removed", change.member.name,
                 change.member.raft, index, ", ".join(sorted(self.members())))
        self._members_changed()

    def _mark_members_dirty(self) -> None:
        self._members_dirty = True

    def _on_truncate(self, index: int) -> None:
        if self._history.changed_at() >= index:
            self._history.truncate_from(index)
            self._members_dirty = True
            log.warning("membership change at or after %d truncated; members now %s",
                        index, ", ".join(sorted(self.members())))
            self._members_changed()

    def _members_changed(self) -> None:
        if self.is_member:
            if self._learner:
                self._learner = False
                self._reintroduce = True  # on the next tick, outside pysyncobj's handler
                log.info("%s is now a voting member of group %s", self.config.node, self.config.group)
            self.stand_for_election(True, NOT_A_MEMBER)
        else:
            if not self._learner:
                log.warning("%s was removed from group %s: it no longer votes or stands for "
                            "election; stop it", self.config.node, self.config.group)
            self.stand_for_election(False, NOT_A_MEMBER)

    def _watch_membership(self) -> None:
        self._startup_dump = False
        if self._reintroduce and self._transport is not None:
            self._reintroduce = False
            self._transport.reintroduce()
        now = time.monotonic()
        if self._members_dirty or now >= self._next_view_check:
            self._members_dirty = False
            self._next_view_check = now + MEMBER_VIEW_CHECK_S
            self._reconcile_members()

    def _reconcile_members(self) -> None:
        """Make pysyncobj's member set the log's again. pysyncobj undoes the changes after a
        stale ``prevLogIdx`` before it asks the journal to delete those entries -- which
        this journal keeps when they match (dledger.journal) -- and re-applies only the
        changes the leader sends again; a real truncation and a log restart change the set
        too. The node this replica receives entries from is kept as well: a member added
        after a snapshot is still to be learned from it. Tick thread only; pysyncobj has no
        public call for this, so its own change routine is used (name-mangled, 0.3.17)."""
        s = self._raft_status()
        prefix = "partner_node_status_server_"
        theirs = {k[len(prefix):] for k in s if k.startswith(prefix)}
        want = {m.raft: m for m in self.members().values() if m.raft != self.config.address}
        leader = self._node._getLeader()
        keep = {leader.address} if leader is not None else set()
        change = self._node._SyncObj__doChangeCluster
        for address in sorted(theirs - set(want) - keep):
            change(["rem", address])
            log.info("pysyncobj's member set: removed %s again, as the log says", address)
        for address in sorted(set(want) - theirs):
            change(["add", want[address].member_id])
            log.info("pysyncobj's member set: added %s (%s) again, as the log says",
                     want[address].name, address)

    def change_membership(self, change: Change, timeout: float = 10.0) -> dict[str, Member]:
        """Leader: add or remove one replica (Raft's single-server change) and wait until the
        change is committed; returns the new member set. Raises ValueError for a change that
        makes no sense, ``ProposeError`` when it could not be made (retry: another change is
        still uncommitted, or this leader has not committed an entry of its term yet)."""
        change.member.check()
        with self._change_lock:
            if not self.is_leader:
                raise self._not_leader()
            members = self.members()
            if change.op == "add":
                clash = [n for n, m in members.items()
                         if n == change.member.name or m.raft == change.member.raft]
                if clash:
                    raise ValueError(f"{change.member.name} ({change.member.raft}) clashes with member "
                                     f"{clash[0]} ({members[clash[0]].raft}): names and Raft addresses "
                                     "must be new")
            else:
                current = members.get(change.member.name)
                if current is None:
                    raise ValueError(f"{change.member.name!r} is not a member ({sorted(members)})")
                if current.raft == self.config.address:
                    raise ValueError(f"{change.member.name} is the leader: transfer the leadership "
                                     "first (raftmq leader transfer)")
                if len(members) == 1:
                    raise ValueError("a group keeps at least one member")
                change = Change("rem", current)
            if self._history.changed_at() > self.committed_index:
                raise ProposalRejected("the previous membership change is not committed yet; retry")
            future: concurrent.futures.Future[None] = concurrent.futures.Future()

            def done(_res: Any, err: int) -> None:
                if err == FAIL_REASON.SUCCESS:
                    future.set_result(None)
                elif err == FAIL_REASON.REQUEST_DENIED:
                    future.set_exception(ProposalRejected(
                        "the leader refused the change: it has not committed an entry of its term "
                        "yet, or the change is a no-op; retry"))
                else:
                    future.set_exception(self._propose_error(err))

            self._node._applyCommand(encode_change(change), done, MEMBERSHIP_PREFIX[0])
            with contextlib.suppress(BlockingIOError):
                self._wakeup.notify()
            try:
                future.result(timeout)
            except concurrent.futures.TimeoutError:
                raise OutcomeUnknown(f"the membership change did not commit within {timeout}s; "
                                     "it may still commit: check the members") from None
            return self.members()

    # -- the retained start, shipped to followers behind it ---------------------------
    def set_snapshot_source(self, source: SnapshotSource) -> None:
        """The state machine whose snapshots go with the retained start: retention then
        cuts the log only where a snapshot of the state before the cut is held."""
        self._snapshots = source
        self._write_log_start()

    def _write_log_start(self) -> None:
        cl = self.commitlog
        if cl.first_index <= 1 or len(cl) < 2:
            return
        first, second = (
            DumpEntry(*self.journal[i], position=cl.position_of(cl.first_index + i))
            for i in (0, 1))
        state = self._snapshots.snapshot_bytes(first.index - 1) if self._snapshots is not None else None
        if self._snapshots is not None and state is None:
            log.error("no snapshot of the state at %d: a follower behind the retained start "
                      "cannot be brought up to date by this node", first.index - 1)
        members = [m.member_id for m in self._history.at(first.index - 1).values()]
        atomic_write(self._dump_path, encode_log_start(first, second, state, members))

    def _read_log_start(self, filename: str) -> tuple[Any, Any, None]:
        """pysyncobj's deserializer, on the tick thread of a follower behind the leader's
        retained start: keep the state snapshot durably, then restart the log."""
        with open(filename, "rb") as f:
            start = decode_log_start(f.read())
        cl = self.commitlog
        if self._startup_dump and cl.first_index == start.first.index and len(cl) >= 2 and \
                cl.term_at(start.first.index) == start.first.term:
            # pysyncobj loads the dump file at start-up too (first tick): our own log start
            nodes = [self._peer_node(m) for m in self.members().values()]
            return start.second.raft_tuple, start.first.raft_tuple, nodes
        if start.state_ref is not None:
            log.warning("the leader's log starts at %d, after this replica's: the log restarts "
                        "there, and the state snapshot at %d (%d bytes) is fetched",
                        start.first.index, start.state_index, start.state_ref.size)
            self._fetch.want(start.state_ref)
        elif start.state is not None:  # a leader of an older version: the snapshot inline
            atomic_write(self._received_path, msgpack.packb([start.state_index, start.state]))
            log.warning("received the leader's state snapshot at index %d (%d bytes); the log "
                        "restarts at %d", start.state_index, len(start.state), start.first.index)
        else:
            log.error("the leader sent no state snapshot with its retained start %d",
                      start.first.index)
        self.journal.stage_reset(start.first.index, start.first.position)
        members = None
        if start.members is not None:
            members = {m.name: m for m in map(Member.parse, start.members)}
        self._history.restart_at(start.first.index - 1, members)
        self._members_dirty = True
        self._members_changed()
        nodes = [self._peer_node(m) for m in self.members().values()]
        sender = self._node._getLeader()
        if sender is not None and sender not in nodes:
            # a member added after the snapshot: its change entry is still to come from it, so
            # pysyncobj must keep the connection it is receiving entries on
            nodes.append(sender)
        log.info("members at the snapshot: %s (receiving from %s)", ", ".join(sorted(self.members())),
                 getattr(sender, "name", None) or "an unknown leader")
        return start.second.raft_tuple, start.first.raft_tuple, nodes

    def received_snapshot(self) -> tuple[int, bytes] | None:
        """(index, snapshot) the leader last sent with its retained start, if any."""
        try:
            index, state = msgpack.unpackb(self._received_path.read_bytes())
        except (OSError, ValueError):
            return None
        return int(index), bytes(state)

    def forget_received_snapshot(self) -> None:
        """The state machine installed it (and keeps its own copy)."""
        self._received_path.unlink(missing_ok=True)

    def _finish_interrupted_reset(self) -> None:
        """A crash between a log reset and its first two appends leaves an empty log
        waiting for its start entry; they are still in the received dump file."""
        awaiting = self.commitlog.awaiting_start
        if not awaiting:
            return
        try:
            start = decode_log_start(self._dump_path.read_bytes())
            first, second = start.first, start.second
        except (OSError, ValueError):
            first = second = None
        if first is None or second is None or first.index != awaiting:
            raise ConfigError(
                f"{self.commitlog_dir}: the log was restarted at index {awaiting} but the entries "
                "that start it are missing; move this node's data directory away so it is "
                "re-fetched from its peers")
        for entry in (first, second):
            kind, body = decode_command(entry.command)
            position = self.commitlog.append(entry.index, entry.term, kind, body)
            if position != entry.position:
                raise ConfigError(f"log restart at {entry.index}: position {position} is not "
                                  f"the leader's {entry.position}")
        self.commitlog.flush()
        log.warning("finished an interrupted log restart at index %d", awaiting)

    @staticmethod
    def _refuse_serialize(filename: str, data: Any) -> None:
        raise RuntimeError("log compaction is disabled")

    # -- retention ---------------------------------------------------------------
    def set_applied_floor(self, applied_index: Callable[[], int]) -> None:
        """Retention keeps every entry above ``applied_index()`` (the state machine's)."""
        self._applied_floor = applied_index

    def _retention_tick(self) -> None:
        # Runs on the tick thread: pysyncobj computes positions relative to the
        # first entry, so the first entry must not move between its own calls.
        if time.monotonic() < self._next_retention:
            return
        self._next_retention = time.monotonic() + self.config.retention_check_s
        try:
            self.enforce_retention()
        except Exception:
            log.exception("retention failed; will retry")

    def enforce_retention(self, now: float | None = None) -> RetentionPlan:
        """Delete expired segments (see dledger.retention). Tick thread only."""
        c, cl = self.config, self.commitlog
        node_floor = min(self.committed_index, self._applied_floor())
        floor = node_floor
        if self.is_leader:
            matches = self._follower_indexes("match_idx_server_")
            floor = min([floor, *matches.values()])
        held = self._snapshots.oldest_held_position() if self._snapshots is not None else None
        keep = cl.write_position if held is None else held  # messages the state still holds back
        plan = plan_retention(
            cl.segments(), c.segment_bytes, now=time.time() if now is None else now,
            max_age_s=c.retention_hours * 3600, max_bytes=c.retention_bytes,
            floor_position=min(self._position_at_or_after(floor), keep),
            node_floor_position=min(self._position_at_or_after(node_floor), keep))
        first = cl.index_at_position(plan.delete_below_position) if plan.segments else None
        if first is not None and self._snapshots is not None:
            first = self._cut_with_snapshot(first)
        if first is not None and first > cl.first_index:
            dropped = cl.delete_before(first)
            self._history.forget_below(first)
            self._write_log_start()
            if self._snapshots is not None:
                self._snapshots.prune_snapshots_below(first - 1)
            log.info("retention deleted %d entries; log now starts at %d (%d bytes kept)",
                     dropped, cl.first_index, cl.write_position - cl.start_position)
        if plan.blocked_by_floor:
            log.info("retention keeps %d expired segments for a lagging follower",
                     plan.blocked_by_floor)
        return plan

    def _cut_with_snapshot(self, first: int) -> int | None:
        """The highest segment start at or below ``first`` after whose previous entry the
        state machine holds a snapshot (None: nowhere, so nothing is deleted)."""
        cl = self.commitlog
        assert self._snapshots is not None
        for held in sorted(self._snapshots.snapshot_indexes(), reverse=True):
            start = held + 1
            if cl.first_index < start <= min(first, cl.last_index) and \
                    cl.position_of(start) % self.config.segment_bytes == 0:
                return start
        return None

    def _position_at_or_after(self, index: int) -> int:
        cl = self.commitlog
        if index < cl.first_index:
            return cl.start_position
        if index > cl.last_index:
            return cl.write_position
        return cl.position_of(index)

    def _raft_status(self) -> dict[str, Any]:
        """pysyncobj's getStatus; it iterates dicts the tick thread may be resizing."""
        for _ in range(10):
            try:
                return self._node.getStatus()
            except RuntimeError:  # "dictionary changed size during iteration"
                continue
        return self._node.getStatus()

    def _follower_indexes(self, prefix: str) -> dict[str, int]:
        s = self._raft_status()
        return {name: s[prefix + addr] for addr, name in self._address_names().items()
                if prefix + addr in s}

    @property
    def fsync_seconds(self) -> LatencyHistogram:
        """How long each fsync of this replica's log took (the journal's flushes)."""
        return self.journal.fsync_seconds

    def followers_behind_retained_start(self) -> list[str]:
        """Followers the leader can no longer feed: they need entries retention deleted."""
        if not self.is_leader:
            return []
        first = self.commitlog.first_index
        behind = sorted(n for n, nxt in self._follower_indexes("next_node_idx_server_").items()
                        if nxt <= first)
        for name in set(behind) - self._behind_reported:
            if self._snapshots is not None and self._snapshots.snapshot_bytes(first - 1) is not None:
                log.warning("follower %s needs entries before %d, which retention deleted: it is "
                            "sent the snapshot at %d and the log from %d", name, first, first - 1, first)
            else:
                log.error("follower %s needs entries before %d, which retention deleted: it cannot "
                          "catch up from this leader (see docs/DURABILITY.md)", name, first)
        self._behind_reported = set(behind)
        return behind

    # -- lifecycle ---------------------------------------------------------------
    def _flush_loop(self) -> None:
        interval = self.config.flush_interval_ms / 1000
        while not self._closed.wait(interval):
            try:
                self.journal.flush()
            except Exception:  # keep flushing; the error is logged each time
                log.exception("async flush failed")

    def close(self) -> None:
        """Stop Raft, flush and close the files. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self.disk.close()
        self._node.destroy_synchronous()  # also closes the journal
        if self._flusher is not None:
            self._flusher.join(timeout=5)
        self.journal._destroy()
