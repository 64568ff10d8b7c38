"""``python -m benchmarks.pop_apply``: what per-message acknowledgement (issue 29) costs the
apply step, and what its state weighs.

Feeds ``BrokerStateMachine.apply`` the entries a SimpleConsumer group makes: messages
stored (records of 32 x 256 B on 2 queues), then per 32 messages one entry of 32 PopClaim
records (one POP) and 32 entries of one PopAck each (acks as single requests: the worst
case), with ``--in-flight`` messages claimed but never acked (held open: the state a stuck
consumer leaves). Prints CPU microseconds per claim and per ack beyond storing the
messages, and the checkpoint form's size of the POP state at the end.

    python -m benchmarks.pop_apply --messages 64000 [--in-flight 5000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import msgpack

from broker.state.machine import BrokerStateMachine
from broker.store.commands import CreateTopic, encode_admin
from broker.store.entry_batch import pack_entries
from broker.store.pop_commands import PopAck, PopClaim
from dledger.storage.entry_format import Entry, EntryKind, record_size
from protocol.record_batch import encode_record

QUEUES, PER_RECORD, STAMP = 2, 32, 1_700_000_000_000


class _Entries:
    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.position = 0

    def add(self, records: list[bytes], stamp: int) -> None:
        (payload,) = pack_entries(records, stamp)
        self.entries.append(Entry(len(self.entries) + 1, 1, EntryKind.DATA, payload, self.position))
        self.position += record_size(len(payload))


def _messages(count: int) -> _Entries:
    out, body = _Entries(), os.urandom(256)
    out.add([encode_admin(CreateTopic("jobs", QUEUES))], STAMP)
    for _ in range(0, count, PER_RECORD * QUEUES):
        records = [encode_record("jobs", q, [(os.urandom(16), STAMP, 0, None, (), {}, 0, body)] * PER_RECORD)
                   for q in range(QUEUES)]
        out.add(records, STAMP)
    return out


def _pops(log: _Entries, count: int, in_flight: int) -> tuple[int, int]:
    """Claims of every message, acks of all but ``in_flight``; returns (claims, acks)."""
    per_queue = count // QUEUES
    claims = acks = 0
    for start in range(0, per_queue, PER_RECORD):
        for q in range(QUEUES):
            offsets = range(start, min(start + PER_RECORD, per_queue))
            log.add([encode_admin(PopClaim("workers", "jobs", q, o, 60_000)) for o in offsets], STAMP + 1)
            claims += len(offsets)
            for o in offsets:
                if q * per_queue + o >= in_flight:
                    log.add([encode_admin(PopAck("workers", "jobs", q, o, 1))], STAMP + 2)
                    acks += 1
    return claims, acks


def _cpu_us(machine: BrokerStateMachine, entries: list[Entry]) -> float:
    started = time.process_time()
    for i in range(0, len(entries), 64):
        machine.apply(entries[i:i + 64])
    return (time.process_time() - started) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.pop_apply", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=64_000)
    ap.add_argument("--in-flight", type=int, default=5_000, help="messages claimed and never acked")
    args = ap.parse_args(argv)
    log = _messages(args.messages)
    stored = len(log.entries)
    claims, acks = _pops(log, args.messages, args.in_flight)
    with tempfile.TemporaryDirectory() as tmp:
        machine = BrokerStateMachine(Path(tmp) / "store", index_slots=1 << 16, index_entries=1 << 20)
        try:
            _cpu_us(machine, log.entries[:stored])
            pop_us = _cpu_us(machine, log.entries[stored:])
            state = machine.pops.state()
        finally:
            machine.close()
    size = len(msgpack.packb(state, use_bin_type=True))
    print(f"{claims} claims (entries of 32) + {acks} acks (an entry each): {pop_us / (claims + acks):.2f} us "
          f"CPU per record; {args.in_flight} in flight at the end: POP state {size:,} B in the "
          f"checkpoint ({size / max(1, args.in_flight):.1f} B per message in flight)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
