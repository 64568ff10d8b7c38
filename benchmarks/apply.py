"""``python -m benchmarks.apply``: CPU per message of the apply step, in isolation.

Feeds ``BrokerStateMachine.apply`` entries of 160 messages of 256 B (idempotent
producers on 8 queues, as ``raftmq bench produce`` sends them) in records of
``--per-record`` messages (64; 1: one message per record, the cost of single sends), one
entry per call, in a temporary directory, and prints wall and CPU microseconds per
message. No network, no Raft: the cost every replica pays for every message it applies.

    python -m benchmarks.apply --entries 1500 [--per-record 64] [--keys 1]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from broker.state.machine import BrokerStateMachine, Outcome
from broker.store.commands import CreateTopic, encode_admin
from broker.store.entry_batch import pack_entries
from dledger.storage.entry_format import Entry, EntryKind, record_size
from protocol.record_batch import encode_record

QUEUES = 8
STAMP = 1_700_000_000_000


def _entries(count: int, per_entry: int, body_bytes: int, per_record: int, keys: int) -> list[Entry]:
    body = os.urandom(body_bytes)
    next_seq = [0] * QUEUES
    entries: list[Entry] = []
    position = 0

    def add(payload: bytes) -> None:
        nonlocal position
        entries.append(Entry(len(entries) + 1, 1, EntryKind.DATA, payload, position))
        position += record_size(len(payload))

    (create,) = pack_entries([encode_admin(CreateTopic("bench", QUEUES))], STAMP)
    add(create)
    for i in range(count):
        q = i % QUEUES
        records = []
        for start in range(0, per_entry, per_record):
            n = min(per_record, per_entry - start)
            names = [tuple(f"key-{i}-{start + k}-{j}" for j in range(keys)) for k in range(n)]
            messages = [(os.urandom(16), STAMP, 0, None, names[k], {}, 0, body) for k in range(n)]
            records.append(encode_record("bench", q, messages, producer_id=f"bench-{q}.0",
                                         base_sequence=next_seq[q], born_host="bench-host"))
            next_seq[q] += n
        (payload,) = pack_entries(records, STAMP + i)
        add(payload)
    return entries


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.apply", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=1500, help="entries to apply (default 1500)")
    ap.add_argument("--per-entry", type=int, default=160, help="messages per entry (default 160)")
    ap.add_argument("--size", type=int, default=256, help="message body bytes (default 256)")
    ap.add_argument("--per-record", type=int, default=64, help="messages per record (default 64)")
    ap.add_argument("--keys", type=int, default=0, help="keys per message (default 0; ids are indexed)")
    args = ap.parse_args(argv)
    entries = _entries(args.entries, args.per_entry, args.size, args.per_record, args.keys)
    with tempfile.TemporaryDirectory(prefix="raftmq-bench-apply-") as tmp:
        sm = BrokerStateMachine(Path(tmp) / "store")
        sm.apply(entries[:1])
        wall, cpu = time.perf_counter(), time.process_time()
        for entry in entries[1:]:
            sm.apply([entry])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        last = sm.results(entries[-1].index)
        sm.close()
    if not last or last[-1].outcome != Outcome.STORED:
        print(f"error: the last message was not stored: {last and last[-1]}")
        return 1
    n = (len(entries) - 1) * args.per_entry
    print(f"{n:,} messages applied: {wall / n * 1e6:.2f} us/message wall, {cpu / n * 1e6:.2f} us CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
