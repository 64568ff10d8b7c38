"""The pysyncobj object of one replica, its configuration, and what it says of the group.

    hand_journal(key, journal)   our RaftJournal for the SyncObj about to be built with
                                 ``journalFile=key`` (pysyncobj's ``createJournal`` name)
    group_conf(config, ...)      the SyncObjConf that closes pysyncobj's defects: no log
                                 compaction, entries far below the batch size, the lease
    RaftNode                     the SyncObj; its one replicated method marks DATA entries
    RaftView                     role, leader, match indexes and connections, in members' names

Configuration closes the remaining defects: log compaction is off (no snapshot install, so
no holes after catch-up -- a lagging follower is fed from the log itself), every entry is
below ``MAX_ENTRY_BYTES`` which is far below ``appendEntriesBatchSizeBytes`` (no chunked
transmission), and ``leaderFallbackTimeout`` is the leader lease (an isolated leader steps
down after ``leader_lease_ms``, default 0.3 s).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any

from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj import syncobj as _syncobj_module

from dledger.config import APPEND_BATCH_BYTES, ConfigError, GroupConfig
from dledger.log_events import Role
from dledger.membership import Member
from dledger.raft.election.candidacy import OUT_OF_REACH_S
from dledger.raft.election.prevote import ElectionDeadlineHold
from dledger.raft.journal import EntryNotStored, RaftJournal

__all__ = ["GroupConf", "RaftNode", "RaftView", "Role", "check_bindable", "group_conf", "hand_journal"]

log = logging.getLogger("dledger.raft_node")

_NEVER = 2**62  # log compaction thresholds: never compact
SOCKET_BUFFER_BYTES = 4 << 20  # fewer, larger socket writes (the kernel may clamp it)
_REFUSALS_PER_TICK = 1000
_CONNECTED = 2  # pysyncobj's partner node status: connected
_STATUS_TRIES = 10


ROLE_OF_STATE = {0: Role.FOLLOWER, 1: Role.CANDIDATE, 2: Role.LEADER}

# -- journal injection ----------------------------------------------------------
_pending_journals: dict[str, RaftJournal] = {}
_stock_create_journal = _syncobj_module.createJournal


def _create_journal(journal_file: Any) -> Any:
    journal = _pending_journals.pop(journal_file, None) if journal_file else None
    return journal if journal is not None else _stock_create_journal(journal_file)


_syncobj_module.createJournal = _create_journal


def hand_journal(key: str, journal: RaftJournal) -> None:
    """The SyncObj built next with ``journalFile=key`` takes ``journal`` (once)."""
    _pending_journals[key] = journal


class GroupConf(SyncObjConf):
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


def group_conf(config: GroupConfig, journal_key: str, dump_path: str,
               deserializer: Callable[[str], Any], standing: bool) -> GroupConf:
    """The conf of one replica's SyncObj. ``deserializer`` reads a leader's log-start dump
    (``dledger.raft.retained_start``); serializing is refused (no log compaction). A replica
    that must not stand (``standing`` false) gets its election timeouts out of reach
    before pysyncobj draws its first election deadline. ConfigError without the cluster
    secret unless ``config.insecure`` (then a WARNING: the port runs whatever it is sent)."""
    config.require_secret()
    if not config.secret:
        log.warning("INSECURE (--insecure): the Raft port of %s listens on %s without a cluster secret: "
                    "anyone who reaches it can run code in this process and read the whole log "
                    "(set group.secret_file)", config.node, config.address)
    lo, hi = (t / 1000 for t in config.election_timeout_ms)
    conf = GroupConf(
        journalFile=journal_key,
        password=config.secret or None,
        bindAddress=config.address,
        autoTickPeriod=0.01,
        # False at start so pysyncobj creates its pipe notifier; Proposals flips it
        appendEntriesUseBatch=False,
        appendEntriesPeriod=config.heartbeat_ms / 1000,
        appendEntriesBatchSizeBytes=APPEND_BATCH_BYTES,
        raftMinTimeout=lo,
        raftMaxTimeout=hi,
        leaderFallbackTimeout=config.leader_lease_ms / 1000,
        connectionTimeout=max(config.election_timeout_ms[1] / 1000 * 2, 2.0),
        connectionRetryTime=config.connect_retry_ms / 1000,
        logCompactionMinEntries=_NEVER,
        logCompactionMinTime=_NEVER,
        dynamicMembershipChange=True,
        commandsWaitLeader=False,
        fullDumpFile=dump_path,
        serializer=_refuse_serialize,
        deserializer=deserializer,
        useFork=False,
        sendBufferSize=SOCKET_BUFFER_BYTES,
        recvBufferSize=SOCKET_BUFFER_BYTES,
    )
    conf.standing_timeouts = (lo, hi)
    if not standing:
        conf.raftMinTimeout = conf.raftMaxTimeout = OUT_OF_REACH_S
    return conf


def _refuse_serialize(filename: str, data: Any) -> None:
    raise RuntimeError("log compaction is disabled")


class RaftNode(SyncObj):
    """The pysyncobj object; its replicated methods mark DATA entries (``_append``) and
    bind entries (``_bind_storage``, numbered after it: pysyncobj numbers them by name).
    Its election deadline is held for pre-vote (``dledger.prevote.ElectionDeadlineHold``)."""

    _SyncObj__raftElectionDeadline = ElectionDeadlineHold()

    @replicated
    def _append(self, payload: bytes) -> int:
        # pysyncobj applies entry i with raftLastApplied == i - 1 and increments
        # it afterwards; the return value reaches the proposer's callback.
        return self.raftLastApplied + 1

    @replicated
    def _bind_storage(self, bindings: bytes) -> int:
        # a bind entry (dledger.membership): its effect is taken when it is appended and
        # committed (dledger.storage_rule); applying it changes nothing here
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


def check_bindable(address: str) -> None:
    """Raises ConfigError naming the Raft address when it cannot be listened on."""
    host, port = address.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, int(port)))
        except OSError as e:
            raise ConfigError(f"cannot listen on Raft address {address}: {e.strerror}") from None


class RaftView:
    """What pysyncobj says of the group, with members named as the log names them. Any
    thread: reads only (pysyncobj's status is retried while the tick thread resizes it)."""

    def __init__(self, node: RaftNode, address: str, name: str,
                 members: Callable[[], dict[str, Member]]) -> None:
        self._node = node
        self._address = address
        self._name = name
        self._members = members

    def raw(self) -> dict[str, Any]:
        """pysyncobj's getStatus; it iterates dicts the tick thread may be resizing."""
        for _ in range(_STATUS_TRIES):
            try:
                return self._node.getStatus()
            except RuntimeError:  # "dictionary changed size during iteration"
                continue
        return self._node.getStatus()

    @property
    def is_leader(self) -> bool:
        return self._node._isLeader()

    @property
    def leader(self) -> str | None:
        """The leader's member name, None when none is known."""
        node = self._node._getLeader()
        return self.address_names().get(node.address) if node is not None else None

    def address_names(self) -> dict[str, str]:
        """Raft address -> member name, this replica's own included."""
        names = {m.raft: name for name, m in self._members().items()}
        names.setdefault(self._address, self._name)
        return names

    def connected(self, s: dict[str, Any] | None = None) -> dict[str, bool]:
        """Every other member: whether pysyncobj is connected to it."""
        s = self.raw() if s is None else s
        return {name: s.get(f"partner_node_status_server_{addr}") == _CONNECTED
                for addr, name in self.address_names().items() if addr != self._address}

    def follower_indexes(self, prefix: str) -> dict[str, int]:
        """A leader's per-follower index (``match_idx_server_``, ``next_node_idx_server_``)."""
        s = self.raw()
        return {name: s[prefix + addr] for addr, name in self.address_names().items()
                if prefix + addr in s}

    def connected_matches(self) -> dict[str, int]:
        """The match index of every member pysyncobj is connected to (a leader's view)."""
        s = self.raw()
        return {name: s.get(f"match_idx_server_{addr}", 0)
                for addr, name in self.address_names().items()
                if s.get(f"partner_node_status_server_{addr}") == _CONNECTED}
