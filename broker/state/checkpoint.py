"""The checkpoint: ``store/state.checkpoint``, what a restart starts from.

msgpack map, written atomically (``common.durable_file.atomic_write``)::

    the replicated state (``broker.state.snapshot``'s "state": last_store_ms, topics, queues,
        offsets, producers, timers, halves, locks, sent_back, cq_hash; users and policies,
        POP windows and groups' retry policies when there are any), and
    "applied"      the entry it describes the state after (``checkpoint_index``)
    "index_mark"   [last IndexFile's sequence, its header's fields]: where the index stood
    "installs"     [[snapshot index, wall ms, first entry never applied here], ...]

It is made durable on its own thread, files first: the ConsumeQueues and IndexFiles are
fsynced -- they then hold at least what the checkpoint describes, having only been appended
to since -- and the checkpoint written. A restart cuts the files back to it and re-applies
the entries after ``applied``: replaying yields the same bytes.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgpack

from broker.store.consume_queue import ConsumeQueue
from broker.store.index_service import IndexService
from common.durable_file import atomic_write, read_or_none

__all__ = ["CheckpointWriter", "read_checkpoint"]


def read_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint at ``path``; empty if there is none."""
    data = read_or_none(path)
    return {} if data is None else msgpack.unpackb(data, strict_map_key=False)


class CheckpointWriter:
    """The apply thread calls ``write``; one checkpoint is made durable at a time.

    A failure to make a checkpoint durable is raised by the next ``write`` or ``wait``.
    """

    def __init__(self, path: Path, durable_index: int) -> None:
        self._path = path
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="broker-checkpoint")
        self._writing: Future[None] | None = None  # the checkpoint being made durable
        #: The ``applied`` of the last checkpoint written (a restart replays from after it).
        self.durable_index = durable_index

    def busy(self) -> bool:
        """A checkpoint is still being made durable."""
        return self._writing is not None and not self._writing.done()

    def wait(self) -> None:
        """Return when the checkpoint being written is durable (raises what its thread met)."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def write(self, state: dict[str, Any], queues: list[ConsumeQueue], index: IndexService,
              background: bool) -> None:
        """Make ``state`` the checkpoint, after fsyncing ``queues`` and ``index``: on the
        checkpoint thread (``background``; returns at once) or before returning."""
        self.wait()
        data = msgpack.packb(state, use_bin_type=True)  # a copy: the tables change on
        if background:
            self._writing = self._executor.submit(self._write, queues, index, data, state["applied"])
        else:
            self._write(queues, index, data, state["applied"])

    def close(self) -> None:
        self.wait()
        self._executor.shutdown()

    def _write(self, queues: list[ConsumeQueue], index: IndexService, data: bytes, applied: int) -> None:
        for cq in queues:
            if not cq.closed:  # a queue deleted meanwhile: replay deletes it again
                cq.flush()
        index.flush()
        atomic_write(self._path, data)
        self.durable_index = applied
