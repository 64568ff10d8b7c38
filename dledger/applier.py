"""Feeds committed entries to a state machine, in index order, exactly once per node.

The state machine owns its applied index and persists it together with the state
it derives (``StateMachine`` contract), so after a crash the applier resumes at
``applied_index() + 1`` and nothing is applied twice or skipped. Every entry is
passed, including Raft no-ops, so the applied index advances contiguously.

When the entries it needs were deleted by retention before this node got them (a
replaced host, a follower down for long), a machine that takes snapshots
(``install_snapshot``) is given the snapshot the leader sent with its retained start
(``ReplicatedLog.received_snapshot``) and goes on after it; until one arrives it waits
and says so (``stalled``): it never skips entries. A machine without snapshots (the
log node's recorder) is told of the gap (``apply_gap``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Protocol

from dledger.log import Log
from dledger.storage.commitlog import LogGap
from dledger.storage.entry_format import Entry

__all__ = ["Applier", "StateMachine"]

log = logging.getLogger("dledger.applier")

_STALLED = "its state machine waits for a snapshot"
STALL_RECHECK_S = 0.1  # while stalled: how often the received snapshot is looked for


class StateMachine(Protocol):
    def applied_index(self) -> int:
        """The last index whose effects are durable in the state machine (0: none)."""

    def apply(self, entries: Sequence[Entry]) -> None:
        """Apply consecutive committed entries starting at ``applied_index() + 1``.

        Must be deterministic (depend only on the entries) and must never raise
        for bad payloads -- a payload it cannot use is recorded as rejected.
        """

    def apply_gap(self, first_index: int) -> None:
        """Entries before ``first_index`` were deleted by retention before this node
        got them; record the gap durably and continue at ``first_index``."""

    # Optional: ``idle()`` is called when nothing was committed for 0.2 s (a machine
    # that checkpoints lazily persists then).


class Applier:
    """A thread applying ``rlog``'s committed entries to ``machine``."""

    def __init__(self, rlog: Log, machine: StateMachine,
                 batch_bytes: int = 4 << 20) -> None:
        self._rlog = rlog
        self._machine = machine
        self._batch_bytes = batch_bytes
        self._stop = threading.Event()
        self._applied = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="dledger-apply", daemon=True)
        #: Why applying cannot go on (None: it can): state this replica cannot derive.
        self.stalled: str | None = None

    def start(self) -> Applier:
        self._thread.start()
        return self

    @property
    def applied_index(self) -> int:
        return self._machine.applied_index()

    def wait_applied(self, index: int, timeout: float) -> bool:
        with self._applied:
            return self._applied.wait_for(lambda: self.applied_index >= index, timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            nxt = self._machine.applied_index() + 1
            if not self._rlog.wait_committed(nxt, 0.2):
                idle = getattr(self._machine, "idle", None)
                if idle is not None:  # optional: a machine that batches its own persistence
                    idle()
                continue
            try:
                entries = self._rlog.read(nxt, self._batch_bytes)
            except LogGap as gap:
                self._bridge(gap)
                continue
            if not entries:  # committed beyond the log's end (an install over a held log): wait
                self._stop.wait(STALL_RECHECK_S)
                continue
            if entries[0].index != nxt:
                log.critical("committed log starts at %d, state machine needs %d",
                             entries[0].index, nxt)
                self._stop.wait(1.0)
                continue
            self._machine.apply(entries)
            with self._applied:
                self._applied.notify_all()

    def _bridge(self, gap: LogGap) -> None:
        install = getattr(self._machine, "install_snapshot", None)
        if install is None:
            log.error("entries %d..%d are gone (retention); the state machine skips them",
                      gap.wanted, gap.first_index - 1)
            self._machine.apply_gap(gap.first_index)
            return
        received = self._rlog.received_snapshot()
        # at the log's start, or later (SnapshotFetch takes a later one, up to the committed
        # index, when no member holds the one the leader named any more)
        if received is not None and received[0] >= gap.first_index - 1:
            try:
                install(*received)
            except ValueError as e:  # damaged: the leader sends it again
                self._stall(f"the snapshot received at {received[0]} cannot be installed: {e}")
                self._rlog.forget_received_snapshot()
                return
            self._rlog.forget_received_snapshot()
            self.stalled = None
            self._rlog.stand_for_election(True, _STALLED)
            log.warning("state restored from the leader's snapshot at %d (entries %d..%d were "
                        "deleted before this node had them)", received[0], gap.wanted, received[0])
            return
        self._stall(f"entries {gap.wanted}..{gap.first_index - 1} were deleted before this node "
                    f"had them and no snapshot of the state at {gap.first_index - 1} arrived yet")

    def _stall(self, why: str) -> None:
        if self.stalled != why:
            log.error("cannot apply: %s; waiting for the leader to send one", why)
            self._rlog.stand_for_election(False, _STALLED)  # it cannot lead with an old state
        self.stalled = why
        # the snapshot arrives as a file (ReplicatedLog.received_snapshot): look again soon,
        # so a fetched snapshot is installed within a tenth of a second
        self._stop.wait(STALL_RECHECK_S)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
