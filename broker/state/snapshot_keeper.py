"""The snapshots a broker replica keeps of its state (``broker.state.snapshot``: the format)
and the recent digests of its state that replicas compare.

``BrokerStateMachine`` decides when: a snapshot before the first entry of every CommitLog
segment, a digest also after every ``digest_every``-th entry and at each verify marker.
Here: writing a snapshot (a full disk raises the disk flag and skips it: retention then
cannot cut the log there), reading and pruning the snapshots held, and the last
``DIGESTS_KEPT`` digests by index (loaded from the snapshots held at start).

Threads: the apply thread takes and records; any thread reads the snapshots and digests.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path

from broker.state.snapshot import Snapshot, SnapshotError, SnapshotStore
from dledger.storage.disk_guard import DiskGuard

__all__ = ["DIGESTS_KEPT", "SnapshotKeeper"]

log = logging.getLogger("broker.state_machine")

DIGESTS_KEPT = 16  # recent state digests kept in memory (shown in /status, compared)


class SnapshotKeeper:
    """The snapshots in ``directory`` and the recent digests (see the module docstring)."""

    def __init__(self, directory: Path, disk: DiskGuard | None) -> None:
        """``disk``: the replica's disk-full flag, raised by a snapshot that does not fit
        (None: the failure is only logged)."""
        self.store = SnapshotStore(directory)
        self._disk = disk
        self._lock = threading.Lock()
        self._digests: dict[int, str] = {}  # recent snapshot index -> digest
        for index in self.store.indexes()[-DIGESTS_KEPT:]:
            with contextlib.suppress(SnapshotError, OSError):
                snap = self.store.load(index)
                if snap is not None:
                    self._digests[index] = snap.digest

    def indexes(self) -> list[int]:
        """The indexes of the snapshots held (durable), oldest first."""
        return self.store.indexes()

    def read(self, index: int) -> bytes | None:
        """The encoded snapshot of the state after entry ``index``, if held."""
        return self.store.read(index)

    def prune_below(self, index: int) -> None:
        """Retention moved the log start past ``index + 1``: older snapshots are not needed."""
        if self.store.prune_below(index):
            log.info("snapshots before %d deleted with the log", index)

    def recent_digests(self) -> dict[int, str]:
        """Digests of the derived state at the most recent snapshot indexes."""
        with self._lock:
            return dict(self._digests)

    def take(self, snap: Snapshot) -> None:
        """Write ``snap`` (taken before a segment's first entry) and record its digest; a
        failure to write is logged and the snapshot skipped."""
        try:
            self.store.write(snap)
        except OSError as e:
            if self._disk is not None:
                self._disk.note(f"writing the snapshot at {snap.index}", e)
            log.error("cannot write the snapshot at %d (retention cannot cut the log there): %s",
                      snap.index, e)
            return
        self.record(snap)
        log.info("snapshot at index %d, state digest %s", snap.index, snap.digest[:16])

    def record(self, snap: Snapshot) -> None:
        """Keep ``snap``'s digest, forgetting all but the ``DIGESTS_KEPT`` newest."""
        with self._lock:
            self._digests[snap.index] = snap.digest
            for old in sorted(self._digests)[:-DIGESTS_KEPT]:
                del self._digests[old]

    def add_installed(self, snap: Snapshot) -> None:
        """Keep the digest of a snapshot installed from the leader (the caller writes it
        once its state is in place)."""
        with self._lock:
            self._digests[snap.index] = snap.digest
