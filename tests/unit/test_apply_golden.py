"""Golden state: one fixed, varied history through the apply step, its results and every
byte it derives pinned to checked-in values.

The history has topics created, deleted and created again; plain and idempotent sends
with resends, gaps and a producer silent for a day; refusals (missing topic, read-only
topic, bad queue, garbage); chains of fragments (whole, cut short by a no-op and resent,
stray, not alone in their entry); delayed messages held and released (twice), retry and
dead-letter copies with their send-back window, transaction halves committed, rolled
back, checked and left open, a held copy whose topic went; offset commits; queue locks
taken, refused, renewed, expired and given back; users and policy statements put,
granted, revoked, deleted and refused. Entries are laid out in 4 KiB segments,
so snapshots are taken before each, and a digest every 16 entries.

Pinned, in ``tests/golden/apply_history/``: each entry's results (``results.txt``); the
last snapshot's bytes (``snapshot.hex``); every derived file's size and SHA-256 --
ConsumeQueue and IndexFiles, snapshots, the checkpoint's content in canonical form -- and
the state digests (``files.txt``). Three ways of getting there must all match them:
applied in uneven batches with checkpoints between; crashed after a checkpoint and
replayed from it; and (digests) a replica that installed a snapshot and applied the rest.

A change that alters any of these alters what replicas derive, what they store or what
senders are told: it must be deliberate. Rewrite the samples with
``RAFTMQ_WRITE_GOLDEN=1 pytest tests/unit/test_apply_golden.py`` and say why in the commit.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import msgpack

from broker.state.held import (
    Prop,
)
from broker.state.machine import BrokerStateMachine
from broker.state.snapshot import canonical_bytes
from broker.store import commands as cmd
from broker.store.commands import encode_admin
from broker.store.entry_batch import pack_entries, read_records
from broker.store.fragments import chain_payloads, encode_fragments
from dledger.storage.entry_format import HEADER_SIZE, Entry, EntryKind, record_size
from protocol.message_format import Message, encode_message
from protocol.record_batch import encode_record

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "apply_history"
WRITE = os.environ.get("RAFTMQ_WRITE_GOLDEN") == "1"
SEGMENT = 4096
T0 = 1_700_000_000_000
DAY = 24 * 3600 * 1000
GEOMETRY = {"cq_units_per_file": 16, "index_slots": 8, "index_entries": 64, "segment_bytes": SEGMENT,
            "digest_every": 16}


class History:
    """Entries laid out as a CommitLog with SEGMENT-byte segments lays them out."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.position = 0
        self.stamp = T0

    def _place(self, kind: EntryKind, payload: bytes) -> Entry:
        size = record_size(len(payload))
        if self.position // SEGMENT != (self.position + size - 1) // SEGMENT:
            self.position = (self.position // SEGMENT + 1) * SEGMENT
        entry = Entry(len(self.entries) + 1, 1, kind, payload, self.position)
        self.position += size
        self.entries.append(entry)
        return entry

    def add(self, *records: bytes, after_ms: int = 100) -> Entry:
        self.stamp += after_ms
        (payload,) = pack_entries(list(records), self.stamp)
        return self._place(EntryKind.DATA, payload)

    def chain(self, message: bytes, upto: int | None = None) -> list[Entry]:
        self.stamp += 100
        payloads = chain_payloads(message, message[4:20], self.stamp, 90)
        return [self._place(EntryKind.DATA, p) for p in payloads[:upto]]

    def noop(self) -> None:
        self._place(EntryKind.NOOP, b"")


def positions(entry: Entry) -> list[int]:
    """The CommitLog position of each record of ``entry``."""
    _, records = read_records(entry.body)
    return [entry.position + HEADER_SIZE + offset for offset, _ in records]


class Messages:
    """Messages with ids 1, 2, 3, ... and bodies and keys derived from them."""

    def __init__(self) -> None:
        self.n = 0

    def many(self, topic: str, queue: int, count: int, *, producer: str | None = None, base: int = -1,
             tags: tuple[str | None, ...] = ("a",)) -> bytes:
        """A record of ``count`` messages (tags taken in turn from ``tags``)."""
        entries = []
        for i in range(count):
            self.n += 1
            entries.append((self.n.to_bytes(16, "big"), T0 + i, 0, tags[i % len(tags)],
                            (f"key-{self.n % 5}",), {}, 0, bytes((self.n * 31 + k) % 256 for k in range(24))))
        return encode_record(topic, queue, entries, producer_id=producer, base_sequence=base,
                             born_host="host-1")

    def __call__(self, topic: str, queue: int = 0, *, tags: str | None = "a", keys: tuple[str, ...] = (),
                 props: dict[str, str] | None = None, producer: str | None = None, seq: int | None = None,
                 size: int = 24, reconsume: int = 0) -> bytes:
        self.n += 1
        return message(self.n, topic, queue, tags, keys, props or {}, producer, seq, size, reconsume)


def message(n: int, topic: str, queue: int, tags: str | None, keys: tuple[str, ...],
            props: dict[str, str], producer: str | None, seq: int | None, size: int,
            reconsume: int) -> bytes:
    body = bytes((n * 31 + k) % 256 for k in range(size))
    return encode_message(Message(topic, body, queue, tags, keys or (f"key-{n % 5}",), props,
                                  n.to_bytes(16, "big"), 0, T0, "host-1", producer, seq, reconsume))


def history() -> History:
    """One story, told in order."""
    h, msg = History(), Messages()
    h.noop()
    h.add(encode_admin(cmd.CreateTopic("orders", 4)), encode_admin(cmd.CreateTopic("audit", 2)),
          encode_admin(cmd.CreateTopic("ro", 1, cmd.Perm.READ)), encode_admin(cmd.CreateTopic("gone", 2)))
    # plain and idempotent sends, resends and gaps
    for n in range(12):
        h.add(*[msg("orders", q, tags=f"t{n % 3}", producer="p1", seq=n) for q in range(4)],
              msg("audit", n % 2, tags=None), msg("gone", n % 2, producer="pg", seq=n // 2))
    h.add(msg("orders", 0, producer="p1", seq=11), msg("orders", 1, producer="p1", seq=3),
          msg("orders", 2, producer="p1", seq=14), msg("orders", 3, producer="p1", seq=12))
    # records of many: one unit each; resent whole (duplicate), overlapping (refused), mixed tags
    batch = msg.many("orders", 1, 5, producer="pb", base=0)
    h.add(batch, msg.many("audit", 0, 3, tags=("x", "y", None)))
    h.add(batch, msg.many("orders", 1, 3, producer="pb", base=3),
          msg.many("orders", 1, 2, producer="pb", base=5), msg.many("orders", 1, 2, producer="pb", base=9))
    old = msgpack.packb([1, bytes(16), "orders", 0, 0, None, [], {}, T0, "h", None, None, 0, b"format 1"])
    h.add(msg("missing"), msg("ro"), msg("orders", 9), b"\x92\x7f\x01", old,
          msgpack.packb([cmd.RecordKind.CREATE_TOPIC, "t", 0, 6]), encode_admin(cmd.DeleteTopic("missing")))
    # offsets and locks
    h.add(encode_admin(cmd.CommitOffset("billing", "orders", 1, 7)),
          encode_admin(cmd.CommitOffset("billing", "gone", 0, 3)),
          encode_admin(cmd.CommitOffset("audit-g", "audit", 1, 2)),
          encode_admin(cmd.CommitOffset("billing", "missing", 0, 1)))
    h.add(encode_admin(cmd.LockQueue("billing", "A", "orders", 0, True)),
          encode_admin(cmd.LockQueue("billing", "B", "orders", 0, True)),
          encode_admin(cmd.LockQueue("billing", "B", "orders", 1, True)),
          encode_admin(cmd.LockQueue("billing", "A", "gone", 1, True)))
    # large messages: whole, cut short by a no-op then resent, a stray fragment, a shared entry
    h.chain(msg("orders", 2, size=400, keys=("big-1",), producer="p1", seq=12))
    cut = msg("audit", 1, size=300, keys=("big-2",), producer="p2", seq=0)
    h.chain(cut, upto=2)
    h.noop()
    h.chain(cut)
    h.chain(cut)  # a resend of the stored one
    h.add(encode_fragments(cut, b"s" * 16, 90)[2])  # continues nothing
    h.add(encode_fragments(cut, b"x" * 16, 90)[0], msg("audit", 0))
    # delayed messages: held, released once, released again (not stored twice)
    later = h.add(msg("orders", 1, props={Prop.DELIVER_AT: str(h.stamp + 5_000), Prop.DELAY: "2"}),
                  msg("orders", 2, props={Prop.DELIVER_AT: str(h.stamp + 9_000)}),
                  msg("gone", 0, props={Prop.DELIVER_AT: str(h.stamp + 9_000), Prop.DELAY: "3"}),
                  msg("orders", 3, props={Prop.DELIVER_AT: str(h.stamp - 1)}))  # due: stored at once
    held = positions(later)
    h.add(msg("orders", 1, props={Prop.SCHEDULED_FROM: str(held[0])}), after_ms=5_000)
    h.add(msg("orders", 1, props={Prop.SCHEDULED_FROM: str(held[0])}),
          msg("orders", 1, props={Prop.SCHEDULED_FROM: "not-a-position"}))
    # transactions: committed, rolled back, checked, left open
    halves = positions(h.add(*[msg("orders", q, props={Prop.TRAN: "true", Prop.PGROUP: "tx"})
                               for q in range(3)]))
    h.add(msg("orders", 0, props={Prop.TRANSACTION_OF: str(halves[0])}),
          encode_admin(cmd.RollbackHalf(halves[1])), encode_admin(cmd.CheckHalf(halves[2], h.stamp)))
    h.add(msg("orders", 0, props={Prop.TRANSACTION_OF: str(halves[0])}),
          encode_admin(cmd.RollbackHalf(halves[1])), encode_admin(cmd.CheckHalf(halves[1], h.stamp)),
          encode_admin(cmd.CheckHalf(halves[2], h.stamp + 1)))
    # retry and dead-letter copies (their topics made on first use), send-backs retried
    for origin, topic in (("g:100", "%RETRY%g"), ("g:100", "%RETRY%g"), ("g:200", "%DLQ%g"),
                          ("h:100", "%RETRY%h")):
        h.add(msg(topic, props={Prop.SENT_BACK: origin, Prop.RETRY_TOPIC: "orders",
                                Prop.DELIVER_AT: str(h.stamp + 10_000)}, reconsume=1), after_ms=1_000)
    for n in range(20):  # filler: more segments, snapshots and digests
        h.add(*[msg("orders", (n + k) % 4, keys=(f"k{n}-{k}",)) for k in range(3)],
              encode_admin(cmd.CommitOffset("billing", "orders", n % 4, n)), after_ms=2_000)
    # deleted means deleted: offsets, producer windows and locks go; recreated, it starts empty
    h.add(encode_admin(cmd.DeleteTopic("gone")))
    h.add(msg("gone", 0, props={Prop.SCHEDULED_FROM: str(held[2])}))  # its held copy: topic gone
    h.add(encode_admin(cmd.CreateTopic("gone", 1)), msg("gone", 0, producer="pg", seq=0),
          encode_admin(cmd.LockQueue("billing", "B", "gone", 0, True)))
    # a minute later: locks expired, send-backs out of their window
    h.add(encode_admin(cmd.LockQueue("billing", "B", "orders", 0, True)),
          encode_admin(cmd.LockQueue("billing", "A", "orders", 0, True)),
          encode_admin(cmd.LockQueue("billing", "B", "orders", 1, False)),
          msg("%RETRY%g", props={Prop.SENT_BACK: "g:100"}), after_ms=61_000)
    h.add(encode_admin(cmd.LockQueue("billing", "A", "orders", 1, True)))
    # a day later: idempotent producers forgotten, a sequence must start again at 0
    h.add(msg("orders", 0, producer="p1", seq=12), after_ms=DAY + 1)
    h.add(msg("orders", 0, producer="p1", seq=0), msg("orders", 2, producer="p1", seq=0))
    for n in range(6):
        h.add(*[msg("audit", q, producer="p2", seq=n) for q in range(2)], after_ms=3_000)
    # users and policy statements (broker.state.access): in the checkpoint and the snapshots
    # from here on, beside records of many; refusals: no such user, a grant of no actions
    h.add(encode_admin(cmd.PutUser("app", False, b"s" * 16, 4096, b"k" * 32, b"v" * 32)),
          encode_admin(cmd.PutUser("ops", True, b"t" * 16, 4096, b"K" * 32, b"V" * 32)),
          encode_admin(cmd.Grant("app", "topic:orders", "allow", "", ("pub", "sub"))),
          encode_admin(cmd.Grant("app", "group:bill*", "allow", "10.0.0.0/8", ("sub",))),
          encode_admin(cmd.Grant("nobody", "topic:orders", "allow", "", ("pub",))),
          encode_admin(cmd.Grant("app", "topic:audit", "deny", "", ())))
    h.add(encode_admin(cmd.Revoke("app", "topic:orders", "allow", "", ("sub",))),
          encode_admin(cmd.DeleteUser("ops")), encode_admin(cmd.DeleteUser("ops")))
    for n in range(8):  # a segment or two further: a snapshot holding them
        h.add(msg.many("orders", n % 4, 6, producer="p3", base=6 * (n // 4)), after_ms=1_000)
    return h


# -- what is pinned ----------------------------------------------------------------------

def results_text(sm: BrokerStateMachine, h: History) -> str:
    lines = []
    for e in h.entries:
        for i, a in enumerate(sm.results(e.index) or []):
            lines.append(f"{e.index}.{i} {a.outcome} q={a.queue_id} off={a.queue_offset} "
                         f"pos={a.position} {a.reason}".rstrip())
    return "\n".join(lines) + "\n"


def files_text(store: Path, sm: BrokerStateMachine) -> str:
    lines = []
    for path in sorted(p for p in store.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name == "state.checkpoint":  # a map written in table order: pinned canonical
            data = canonical_bytes(msgpack.unpackb(data, strict_map_key=False))
        lines.append(f"{path.relative_to(store)} {len(data)} {hashlib.sha256(data).hexdigest()}")
    lines += [f"digest {i} {d}" for i, d in sorted(sm.recent_digests().items())]
    return "\n".join(lines) + "\n"


def check(name: str, got: str) -> None:
    path = GOLDEN / name
    if WRITE:
        path.write_text(got)
        return
    assert path.exists(), f"no sample {path}: write it with RAFTMQ_WRITE_GOLDEN=1 (see the docstring)"
    want = path.read_text().splitlines()
    for n, (a, b) in enumerate(zip(want, got.splitlines(), strict=False)):
        assert a == b, f"{name} line {n + 1} changed:\n  was {a}\n  now {b}"
    lines = len(got.splitlines())
    assert len(want) == lines, f"{name}: {len(want)} lines before, now {lines}"


def _hex(data: bytes) -> str:
    return "".join(data[i:i + 32].hex() + "\n" for i in range(0, len(data), 32))


# -- the test ------------------------------------------------------------------------------

def test_a_fixed_history_derives_the_pinned_results_and_bytes(tmp_path: Path) -> None:
    h = history()
    entries = h.entries
    assert len(entries) > 80 and h.position > 4 * SEGMENT

    whole = BrokerStateMachine(tmp_path / "whole", **GEOMETRY)  # type: ignore[arg-type]
    i, steps = 0, [1, 5, 2, 9, 3]
    for n, step in enumerate(steps * 100):
        if i >= len(entries):
            break
        whole.apply(entries[i:i + step])
        i += step
        if n % 4 == 3:
            whole.checkpoint()
    check("results.txt", results_text(whole, h))
    snapshots = whole.snapshot_indexes()
    assert len(snapshots) >= 4
    last = whole.snapshot_bytes(snapshots[-1])
    assert last is not None
    check("snapshot.hex", _hex(last))
    digests = whole.recent_digests()
    whole.close()
    reopened = BrokerStateMachine(tmp_path / "whole", **GEOMETRY)  # type: ignore[arg-type]
    want_files = files_text(tmp_path / "whole", reopened)
    reopened.close()
    check("files.txt", want_files)

    # crashed after a checkpoint, replayed from it: the same bytes
    crashed = tmp_path / "crashed"
    sm = BrokerStateMachine(crashed, **GEOMETRY)  # type: ignore[arg-type]
    sm.apply(entries[:60])
    sm.checkpoint()
    saved = (crashed / "state.checkpoint").read_bytes()
    sm.apply(entries[60:75])
    sm.close()
    (crashed / "state.checkpoint").write_bytes(saved)
    sm = BrokerStateMachine(crashed, **GEOMETRY)  # type: ignore[arg-type]
    assert sm.applied_index() <= 60
    sm.apply(entries[sm.applied_index():])
    sm.close()
    sm = BrokerStateMachine(crashed, **GEOMETRY)  # type: ignore[arg-type]
    assert files_text(crashed, sm) == want_files
    sm.close()

    # a replica that installed a snapshot, then applied the rest: the same digests from there
    at = snapshots[1]
    data = (tmp_path / "whole" / "snapshots" / f"{at:020d}.snap").read_bytes()
    installed = BrokerStateMachine(tmp_path / "installed", **GEOMETRY)  # type: ignore[arg-type]
    installed.install_snapshot(at, data)
    installed.apply(entries[at:])
    mine = installed.recent_digests()
    assert max(mine) == max(digests) and len(mine) >= 8
    assert {i: d for i, d in mine.items() if i in digests} == {i: digests[i] for i in mine if i in digests}
    assert installed.snapshot_bytes(snapshots[-1]) == last
    installed.close()
