"""The deliberately BROKEN broker of the chaos suite's self-test (``python -m
tests.support.unsafe_broker --config ...``, started by ``test_verifier_selftest.py``).

Its leader answers a send STORED, at guessed queue offsets, as soon as the entry is
proposed to its own log -- before a majority holds it -- so acknowledged messages are
lost on failover, which the verifier must catch. It is the real broker with one
``WritePath`` hook overridden; nothing in the production packages can turn it on.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import broker.remoting.server
from broker.node import main
from broker.replication.write_path import WritePath
from broker.state.machine import Applied, Outcome
from broker.store.commands import RecordKind, record_kind
from protocol.record_batch import MessageFormatError, read_header

log = logging.getLogger("tests.unsafe_broker")


class UnsafeWritePath(WritePath):
    """Answers every caller whose records are all messages right after proposing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guessed_next: dict[tuple[str, int], int] = {}
        log.critical("TEST-ONLY BROKEN BUILD: sends are acknowledged before a majority commits "
                     "them; acknowledged messages WILL be lost on failover")

    def _proposed(self, batch: list[Any]) -> None:
        for p in batch:
            if p.future.done() or any(record_kind(r) != RecordKind.MESSAGE for r in p.records):
                continue
            try:
                guessed = [self._guess_place(r) for r in p.records]
            except MessageFormatError:
                continue  # the apply step will refuse it; let that answer
            p.future.set_result(guessed)

    def _guess_place(self, record: bytes) -> Applied:
        h = read_header(record)
        key = (h.topic, h.queue_id)
        cq = self._machine.queue(*key)
        offset = max(self._guessed_next.get(key, 0), cq.max_offset if cq is not None else 0)
        self._guessed_next[key] = offset + h.count
        return Applied(Outcome.STORED, h.queue_id, offset)


if __name__ == "__main__":
    broker.remoting.server.WritePath = UnsafeWritePath  # type: ignore[misc]
    sys.exit(main())
