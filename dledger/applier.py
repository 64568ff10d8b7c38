"""Feeds committed entries to a state machine, in index order, exactly once per node.

The state machine owns its applied index and persists it together with the state
it derives (``StateMachine`` contract), so after a crash the applier resumes at
``applied_index() + 1`` and nothing is applied twice or skipped. Every entry is
passed, including Raft no-ops, so the applied index advances contiguously.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Protocol

from dledger.entry_format import Entry
from dledger.journal import LogGap
from dledger.replicated_log import ReplicatedLog

__all__ = ["Applier", "StateMachine"]

log = logging.getLogger("dledger.applier")


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

    def __init__(self, rlog: ReplicatedLog, machine: StateMachine,
                 batch_bytes: int = 4 << 20) -> None:
        self._rlog = rlog
        self._machine = machine
        self._batch_bytes = batch_bytes
        self._stop = threading.Event()
        self._applied = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="dledger-apply", daemon=True)

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
                log.error("entries %d..%d are gone (retention); the state machine skips them",
                          nxt, gap.first_index - 1)
                self._machine.apply_gap(gap.first_index)
                continue
            if not entries:
                continue
            if entries[0].index != nxt:
                log.critical("committed log starts at %d, state machine needs %d",
                             entries[0].index, nxt)
                self._stop.wait(1.0)
                continue
            self._machine.apply(entries)
            with self._applied:
                self._applied.notify_all()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
