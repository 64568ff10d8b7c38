"""The leader's write path: records in, outcomes out, many records per Raft entry.

    send(records) ──▶ accumulator ──(at once when no batch is in flight, else linger ms)──▶ pack_entries(now)
                                                   large messages: chain_payloads(now)
                                                                     │ propose (one entry each)
    outcomes ◀── machine.results(index) ◀── applier applied index ◀──┘ committed

A message whose encoded bytes do not fit one entry (``entry_batch.max_message_bytes``)
is split into a chain of fragments (``broker.store.fragments``), proposed as consecutive
entries in its place among the batch's records; its caller gets one outcome, the
result of the last fragment's entry. The entries of one batch are proposed back to
back, in one step of the event loop, so no other entry from this leader lands
between the fragments of a chain. There must be one WritePath per Log.

Batches are pipelined: a batch is proposed as soon as it is packed, while earlier
ones are still replicating (at most ``MAX_IN_FLIGHT`` batches), and Raft keeps them
in proposal order. Callers wait for their entry's apply on the event loop (the
apply thread wakes them through ``on_applied``), not on threads.

Records are validated by the caller (names, sizes, topic existence is re-checked
at apply). Concurrent senders share entries (group commit: one fsync and one
replication round for many records); each caller gets the ``Applied`` outcomes
of its own records, in order. The store timestamp is the leader's clock at
packing time and travels in the entry, so every replica applies the same value.

Errors: ``MessageTooLarge`` at once (nothing sent) for a message over
``max_message_bytes`` or another record over the entry limit. ``dledger`` propose
errors (NotLeader, NoLeader, OutcomeUnknown, DiskFull, ...) reach every caller whose
records were in the failed entry (or chain). A timeout while waiting is ``OutcomeUnknown``
(the entry may still commit), or ``DiskFull`` saying so while members' disks are full.

Runs on one asyncio loop; ``send`` must be called from that loop.

Two stages of an entry's commit (``dledger.stage_clock``) are timed here: ``receive``, each
sender's wait from ``send`` to its entries' proposal (the accumulator's group commit), and
``answer``, a batch's wait from its last entry's commit to its callers' outcomes (the
state machine's apply on the apply thread and the hand-off back to the loop).

``_proposed(batch)`` is called once a batch's entries are proposed, before any of
them commits; it does nothing here. (The chaos suite's deliberately broken build,
``tests/support/unsafe_broker.py``, overrides it to answer early: production code has
no switch for it.)
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from broker.state.machine import Applied, BrokerStateMachine
from broker.store.commands import RecordKind, record_kind
from broker.store.entry_batch import MessageTooLarge, max_message_bytes, pack_entries
from broker.store.fragments import chain_payloads
from dledger.applier import Applier
from dledger.errors import DiskFull, OutcomeUnknown
from dledger.log import Log
from protocol.message_format import MAX_MESSAGE_BYTES, peek_msg_id

__all__ = ["MAX_IN_FLIGHT", "WritePath"]

#: Batches proposed and not yet answered, at most (back-pressure on senders beyond).
MAX_IN_FLIGHT = 64


@dataclass
class _Pending:
    records: list[bytes]
    future: asyncio.Future[list[Applied]] = field(default_factory=asyncio.Future)
    sent: float = field(default_factory=time.perf_counter)  # when ``send`` took it


class WritePath:
    def __init__(self, rlog: Log, machine: BrokerStateMachine, applier: Applier, *,
                 linger_ms: float = 1.0, timeout_s: float = 10.0,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        if max_message_bytes < 1:
            raise ValueError("max_message_bytes must be positive")
        self._max_message = max_message_bytes
        self._rlog = rlog
        self._machine = machine
        self._applier = applier
        self._linger = linger_ms / 1000
        self._timeout = timeout_s
        self._clock_ms = clock_ms
        self._queue: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self._last_stamp = 0
        self._in_flight: asyncio.Semaphore | None = None
        self._writes: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []  # heap by index
        self._tie = itertools.count()
        machine.on_applied.append(self._on_applied)

    def _on_applied(self, index: int) -> None:
        """Apply thread: wake the callers waiting for entries up to ``index``."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(self._release, index)

    def _release(self, index: int) -> None:
        while self._waiters and self._waiters[0][0] <= index:
            fut = heapq.heappop(self._waiters)[2]
            if not fut.done():
                fut.set_result(None)

    async def send(self, records: Sequence[bytes]) -> list[Applied]:
        """Replicate ``records`` and return their outcomes once applied on this node.

        Raises ``MessageTooLarge`` (nothing sent) for a message over ``max_message_bytes``
        or another record that cannot fit in an entry.
        """
        limit = max_message_bytes()
        for r in records:
            if len(r) > self._max_message:
                raise MessageTooLarge(
                    f"message of {len(r)} bytes exceeds the {self._max_message}-byte limit")
            if len(r) > limit and record_kind(r) != RecordKind.MESSAGE:
                raise MessageTooLarge(f"record of {len(r)} bytes exceeds the {limit}-byte entry limit")
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
        pending = _Pending(list(records))
        self._queue.append(pending)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_soon())
        return await pending.future

    def linger_now(self) -> float:
        """Seconds records wait before they are packed: none while nothing is proposed and
        unanswered (what comes in this turn of the loop joins), else the linger, so that
        the records arriving meanwhile share an entry."""
        return self._linger if self._writes else 0.0

    async def _flush_soon(self) -> None:
        await asyncio.sleep(self.linger_now())
        assert self._in_flight is not None
        while self._queue:
            await self._in_flight.acquire()
            batch, self._queue = self._queue, []
            # _write proposes before its first await; tasks start in creation order,
            # so entries are proposed in batch order
            task = asyncio.get_running_loop().create_task(self._write(batch))
            self._writes.add(task)
            task.add_done_callback(self._write_done)

    def _write_done(self, task: asyncio.Task[None]) -> None:
        self._writes.discard(task)
        assert self._in_flight is not None
        self._in_flight.release()

    def _stamp(self) -> int:
        # Store times never go backwards, even if this leader's clock is behind the
        # previous leader's: ConsumeQueue time search and IndexFile ranges rely on it.
        self._last_stamp = max(self._last_stamp, self._clock_ms(), self._machine.last_store_ms)
        return self._last_stamp

    async def _write(self, batch: list[_Pending]) -> None:
        records = [r for p in batch for r in p.records]
        futures: list[tuple[asyncio.Future[Any], bool]] = []
        try:
            plan = self._plan(records, self._stamp())
            outcomes: list[Applied] = []
            # all proposed before the first await: the entries are back to back
            proposals = [(self._rlog.propose(p), answers) for p, answers in plan]
            futures = [(asyncio.wrap_future(f), answers) for f, answers in proposals]
            self._proposed(batch)
            self._observe_receive(batch)
            committed: list[float] = []
            if proposals:  # none for a send of no records
                proposals[-1][0].add_done_callback(lambda _: committed.append(time.perf_counter()))
            for fut, answers in futures:
                appended = await asyncio.wait_for(fut, self._timeout)
                if answers:
                    outcomes.extend(await self._results_of(appended.index))
            if committed:
                self._observe("answer", time.perf_counter() - committed[0])
        except Exception as e:  # every caller in this batch learns the same error
            for fut, _ in futures:
                fut.add_done_callback(_retrieve)  # later entries' errors are the same news
            if isinstance(e, TimeoutError):
                e = self._timed_out()
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(e)
            return
        start = 0
        for p in batch:
            if not p.future.done():
                p.future.set_result(outcomes[start:start + len(p.records)])
            start += len(p.records)

    def _observe_receive(self, batch: list[_Pending]) -> None:
        """Each sender's wait from ``send`` to its entries' proposal (the accumulator)."""
        now = time.perf_counter()
        for p in batch:
            self._observe("receive", now - p.sent)

    def _observe(self, stage: str, seconds: float) -> None:
        """A server stage of ``dledger.stage_clock`` (the loop is its one writer)."""
        histogram = self._rlog.stage_seconds.get(stage)
        if histogram is not None:
            histogram.observe(seconds)

    def _timed_out(self) -> Exception:
        """The error for an entry that did not commit in time: DiskFull when members' disks
        are full (it may still commit once there is room), else OutcomeUnknown."""
        full = self._rlog.disk_full_nodes()
        if full:
            return DiskFull(full, f"replicas {', '.join(full)} of group {self._rlog.config.group} "
                            "cannot store entries: their disks are full. The write did not commit "
                            "in time; it may still commit once space is freed", may_have_committed=True)
        return OutcomeUnknown("timed out waiting for the entry to commit")

    def _proposed(self, batch: list[_Pending]) -> None:
        """The entries of ``batch`` are proposed, none committed yet (module docstring)."""

    @staticmethod
    def _plan(records: list[bytes], stamp: int) -> list[tuple[bytes, bool]]:
        """The entry payloads for ``records`` in order, each with whether its apply
        results answer records (every entry but a chain's non-last fragments)."""
        plan: list[tuple[bytes, bool]] = []
        run: list[bytes] = []
        limit = max_message_bytes()
        for record in records:
            if len(record) <= limit:
                run.append(record)
                continue
            plan.extend((p, True) for p in pack_entries(run, stamp))
            run = []
            # an id that is not readable gives zeros: the apply step refuses the message
            chain = chain_payloads(record, peek_msg_id(record) or bytes(16), stamp)
            plan.extend((p, i == len(chain) - 1) for i, p in enumerate(chain))
        plan.extend((p, True) for p in pack_entries(run, stamp))
        return plan

    async def _results_of(self, index: int) -> list[Applied]:
        if self._machine.applied_index() < index:
            fut = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiters, (index, next(self._tie), fut))
            self._release(self._machine.applied_index())  # applied meanwhile?
            try:
                await asyncio.wait_for(fut, self._timeout)
            except TimeoutError:
                raise OutcomeUnknown(f"entry {index} committed but was not applied in time") from None
        results = self._machine.results(index)
        if results is None:
            raise OutcomeUnknown(f"entry {index} committed but its outcome is not available")
        return results


def _retrieve(fut: asyncio.Future[object]) -> None:
    if not fut.cancelled():
        fut.exception()
