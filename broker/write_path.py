"""The leader's write path: records in, outcomes out, many records per Raft entry.

    send(records) ──▶ accumulator ──(linger ms or a full entry)──▶ pack_entries(now)
                                                                     │ propose (one entry each)
    outcomes ◀── machine.results(index) ◀── applier applied index ◀──┘ committed

Records are validated by the caller (names, sizes, topic existence is re-checked
at apply). Concurrent senders share entries (group commit: one fsync and one
replication round for many records); each caller gets the ``Applied`` outcomes
of its own records, in order. The store timestamp is the leader's clock at
packing time and travels in the entry, so every replica applies the same value.

Errors: ``dledger`` propose errors (NotLeader, NoLeader, OutcomeUnknown, ...)
reach every caller whose records were in the failed entry. A timeout while
waiting is ``OutcomeUnknown`` (the entry may still commit).

Runs on one asyncio loop; ``send`` must be called from that loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from broker.entry_batch import MessageTooLarge, max_message_bytes, pack_entries
from broker.state_machine import Applied, BrokerStateMachine
from dledger.applier import Applier
from dledger.errors import OutcomeUnknown
from dledger.replicated_log import ReplicatedLog

__all__ = ["WritePath"]


@dataclass
class _Pending:
    records: list[bytes]
    future: asyncio.Future[list[Applied]] = field(default_factory=asyncio.Future)


class WritePath:
    def __init__(self, rlog: ReplicatedLog, machine: BrokerStateMachine, applier: Applier, *,
                 linger_ms: float = 1.0, timeout_s: float = 10.0,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        self._rlog = rlog
        self._machine = machine
        self._applier = applier
        self._linger = linger_ms / 1000
        self._timeout = timeout_s
        self._clock_ms = clock_ms
        self._queue: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self._last_stamp = 0

    async def send(self, records: Sequence[bytes]) -> list[Applied]:
        """Replicate ``records`` and return their outcomes once applied on this node.

        Raises ``MessageTooLarge`` (nothing sent) for a record that cannot fit in an entry.
        """
        limit = max_message_bytes()
        for r in records:
            if len(r) > limit:
                raise MessageTooLarge(f"record of {len(r)} bytes exceeds the {limit}-byte entry limit")
        pending = _Pending(list(records))
        self._queue.append(pending)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_soon())
        return await pending.future

    async def _flush_soon(self) -> None:
        await asyncio.sleep(self._linger)
        while self._queue:
            batch, self._queue = self._queue, []
            await self._write(batch)

    def _stamp(self) -> int:
        # Store times never go backwards, even if this leader's clock is behind the
        # previous leader's: ConsumeQueue time search and IndexFile ranges rely on it.
        self._last_stamp = max(self._last_stamp, self._clock_ms(), self._machine.last_store_ms)
        return self._last_stamp

    async def _write(self, batch: list[_Pending]) -> None:
        records = [r for p in batch for r in p.records]
        try:
            payloads = pack_entries(records, self._stamp())
            outcomes: list[Applied] = []
            futures = [asyncio.wrap_future(self._rlog.propose(p)) for p in payloads]
            for fut in futures:
                appended = await asyncio.wait_for(fut, self._timeout)
                outcomes.extend(await self._results_of(appended.index))
        except Exception as e:  # every caller in this batch learns the same error
            if isinstance(e, TimeoutError):
                e = OutcomeUnknown("timed out waiting for the entry to commit")
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(e)
            return
        start = 0
        for p in batch:
            if not p.future.done():
                p.future.set_result(outcomes[start:start + len(p.records)])
            start += len(p.records)

    async def _results_of(self, index: int) -> list[Applied]:
        loop = asyncio.get_running_loop()
        applied = await loop.run_in_executor(None, self._applier.wait_applied, index, self._timeout)
        results = self._machine.results(index) if applied else None
        if results is None:
            raise OutcomeUnknown(f"entry {index} committed but its outcome is not available")
        return results
