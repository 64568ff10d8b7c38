"""A leader's proposals in flight: each one's future, and how many bytes are not committed.

    submit(payload) -> Future[Appended]   hand a DATA entry to pysyncobj (checks done by
                                          the caller: leadership, disks, a transfer)
    fail_in_flight()                      leadership lost: every future OutcomeUnknown
    not_stored(command)                   the disk refused this leader's own entry: DiskFull

The bytes in flight choose pysyncobj's send mode (``appendEntriesUseBatch``, read from
our conf object at each use, 0.3.17 pinned): little in flight, each proposal is sent at
once and wakes the tick thread (low latency); much, appends are batched per heartbeat
(throughput). Measured on 2 cores: one in flight commits in 2.4 ms instead of 12.8 ms,
while 32 in flight of 30 KiB reach ~1,350 entries/s instead of 610 (docs/BENCHMARKS.md).

Threads: ``submit`` from any thread; pysyncobj's callbacks and ``not_stored`` on the tick
thread; ``fail_in_flight`` on the tick thread. One lock guards the maps.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from pysyncobj.config import FAIL_REASON
from pysyncobj.pipe_notifier import PipeNotifier

from dledger.errors import DiskFull, NoLeader, NotLeader, OutcomeUnknown, ProposalRejected, ProposeError
from dledger.log_events import Appended
from dledger.raft.codec import encode_payload_command
from dledger.raft.journal import RaftJournal
from dledger.raft.node import GroupConf, RaftNode
from dledger.storage.commitlog import CommitLog

__all__ = ["BATCH_ABOVE_BYTES", "Appended", "Proposals", "propose_error"]

#: More proposed bytes in flight than this: appends are batched per heartbeat.
BATCH_ABOVE_BYTES = 128 * 1024

Answer = concurrent.futures.Future["Appended"]


def propose_error(err: int, not_leader: Callable[[], NotLeader | NoLeader]) -> ProposeError:
    """The error of a proposal pysyncobj answered with ``err`` (a FAIL_REASON)."""
    if err in (FAIL_REASON.LEADER_CHANGED, FAIL_REASON.UNKNOWN_OUTCOME):
        return OutcomeUnknown(f"leadership changed before the entry committed (code {err})")
    if err == FAIL_REASON.DISCARDED:
        return ProposalRejected("a new leader replaced the entry; it was not committed")
    if err in (FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER):
        return not_leader()
    return ProposalRejected(f"proposal refused by the leader (code {err})")


def wake(notifier: PipeNotifier) -> None:
    """Wake pysyncobj's tick thread (a full pipe: it is awake already)."""
    with contextlib.suppress(BlockingIOError):
        notifier.notify()


class Proposals:
    """The proposals this leader made and pysyncobj has not answered yet."""

    def __init__(self, node: RaftNode, conf: GroupConf, wakeup: PipeNotifier, journal: RaftJournal,
                 commitlog: CommitLog, not_leader: Callable[[], NotLeader | NoLeader]) -> None:
        self._node = node
        self._conf = conf
        self._wakeup = wakeup
        self._journal = journal
        self._commitlog = commitlog
        self._not_leader = not_leader
        self._in_flight: dict[Answer, int] = {}  # -> payload bytes
        #: id of a proposal's command bytes -> (those bytes, its future), until it is answered
        self._commands: dict[int, tuple[bytes, Answer]] = {}
        self._in_flight_bytes = 0
        self._lock = threading.Lock()

    def submit(self, payload: bytes) -> Answer:
        """Append ``payload`` as one DATA entry; the future resolves with ``Appended`` once
        committed, or fails with a ``ProposeError`` (see ``ReplicatedLog.propose``)."""
        future: Answer = concurrent.futures.Future()
        command = encode_payload_command(payload)
        with self._lock:
            self._in_flight[future] = len(payload)
            self._in_flight_bytes += len(payload)
            self._commands[id(command)] = (command, future)
            self._adapt_batching()
        future.add_done_callback(lambda f: self._forget(f, id(command)))
        self._journal.stages.proposed(command)
        self._node._applyCommand(command, lambda res, err: self._done(future, res, err))
        wake(self._wakeup)
        return future

    def _forget(self, future: Answer, command_id: int) -> None:
        with self._lock:
            self._in_flight_bytes -= self._in_flight.pop(future, 0)
            held = self._commands.get(command_id)
            if held is not None and held[1] is future:
                del self._commands[command_id]
            self._adapt_batching()

    def _adapt_batching(self) -> None:
        """Under the lock: batched appends above ``BATCH_ABOVE_BYTES`` in flight."""
        self._conf.appendEntriesUseBatch = self._in_flight_bytes > BATCH_ABOVE_BYTES

    def fail_in_flight(self) -> None:
        """Leadership was lost: pysyncobj will never call these proposals back, so answer
        them now. They may still commit under the next leader: OutcomeUnknown."""
        with self._lock:
            pending, self._in_flight = list(self._in_flight), {}
            self._in_flight_bytes = 0
            self._adapt_batching()
        for future in pending:
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                future.set_exception(OutcomeUnknown(
                    "this node lost the leadership before the entry committed; it may still commit"))

    def _done(self, future: Answer, index: Any, err: int) -> None:
        if future.done():  # answered when the leadership was lost
            return
        if err == FAIL_REASON.SUCCESS:
            self._journal.flush()  # a one-node group acks here; otherwise a no-op
            appended = Appended(index, self._commitlog.term_at(index), self._commitlog.position_of(index))
            self._journal.stages.applied(index)
            future.set_result(appended)
            return
        future.set_exception(propose_error(err, self._not_leader))

    def not_stored(self, command: bytes, error: Callable[[], DiskFull]) -> None:
        """Tick thread: the disk could not take ``command``. If it is one of these proposals,
        it was never appended: it fails with ``error()`` (not committed)."""
        with self._lock:
            held = self._commands.get(id(command))
        if held is not None and held[0] is command:
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                held[1].set_exception(error())
