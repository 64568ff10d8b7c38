"""Golden bytes: one checked-in sample per wire and on-disk format.

Each sample is built here from fixed inputs and compared with ``tests/golden/<name>.hex``
(hex, 32 bytes a line, so a diff shows where a layout moved). A test fails when an
encoder's output changes -- a layout change must be deliberate: bump the format's
version, keep reading the old one where stores or peers may still hold it, and rewrite
the samples with ``RAFTMQ_WRITE_GOLDEN=1 pytest tests/unit/test_golden_bytes.py``.
Decoders are checked on the same bytes, so a sample also pins what old data must
still decode to.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from broker.state.snapshot import Snapshot, cq_hash_prefix, cq_hash_step
from broker.store.commands import (
    CheckHalf,
    CommitOffset,
    CreateTopic,
    DeleteTopic,
    LockQueue,
    Perm,
    RollbackHalf,
    VerifyMarker,
    decode_admin,
    encode_admin,
)
from broker.store.consume_queue_layout import UNIT
from broker.store.entry_batch import pack_entries, unpack_entry
from broker.store.index_file import IndexFile
from broker.store.index_layout import key_hash
from dledger.membership import MEMBERSHIP_PREFIX, Change, Member, decode_change, encode_change
from dledger.storage.entry_format import EntryKind, decode_entry, encode_blank, encode_entry
from dledger.storage.hard_state import HardState, decode_slot, encode_slot
from dledger.storage.log_start import DumpEntry, StateRef, decode_log_start, encode_log_start
from protocol.message_format import decode_message
from protocol.pull import PullRequest, PullResponse, PullRow
from protocol.record_batch import decode_messages, encode_record
from protocol.remoting import Frame, RequestCode, ResponseCode, decode_frame
from protocol.send import SendBatchRequest, SendBatchResponse, SendRow
from protocol.tags import tag_hash
from protocol.wire import NotLeaderResponse

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
WRITE = os.environ.get("RAFTMQ_WRITE_GOLDEN") == "1"

MSG_ID = bytes(range(16))
STORE_MS = 1_795_000_000_123


def _hex(data: bytes) -> str:
    return "".join(data[i:i + 32].hex() + "\n" for i in range(0, len(data), 32))


def check(name: str, data: bytes) -> None:
    path = GOLDEN / f"{name}.hex"
    if WRITE:
        path.write_text(_hex(data))
        return
    assert path.exists(), f"no sample {path}: write it with RAFTMQ_WRITE_GOLDEN=1"
    want = path.read_text()
    got = _hex(data)
    if got != want:
        lines = zip(want.splitlines(), got.splitlines(), strict=False)
        where = next((i for i, (a, b) in enumerate(lines) if a != b), min(len(want), len(got)) // 65)
        raise AssertionError(f"{name}: the encoding changed at byte ~{where * 32} "
                             f"({len(data)} bytes now, {len(bytes.fromhex(want.replace(chr(10), '')))} "
                             "in the sample); see this module's docstring")


def message() -> bytes:
    """A record of one message."""
    return encode_record("orders", 3, [(MSG_ID, 1_795_000_000_000, 0, "tagA", ["k1", "k2"], {"color": "red"},
                                        0, b"hello")], producer_id="producer-1", base_sequence=41,
                         born_host="10.0.0.9:52000")


def record() -> bytes:
    """A record of three messages: one without tag or keys, a property, a later born time."""
    return encode_record("orders", 3, [
        (MSG_ID, 1_795_000_000_000, 0, "tagA", ["k1"], {}, 0, b"one"),
        (bytes(range(16, 32)), 1_795_000_000_007, 0, None, [], {"color": "red"}, 0, b"two"),
        (bytes(range(32, 48)), 1_795_000_000_007, 4, "tagB", ["k2", "k3"], {}, 2, b"three"),
    ], producer_id="producer-1", base_sequence=41, born_host="10.0.0.9:52000")


def test_frames() -> None:
    request = Frame.request(RequestCode.SEND_MESSAGE, 7, {"topic": "orders", "queueId": 3, "ok": True},
                            body=b"\x01\x02")
    check("frame_request", request.encode())
    response = request.response(ResponseCode.SUCCESS, {"offset": 12, "ids": [1, 2]}, body=b"")
    check("frame_response", response.encode())
    assert decode_frame(request.encode()) == request


def test_typed_frames() -> None:
    """A few representative requests and answers as their classes encode them (every class
    against the hand-built frames of the version before: tests/unit/test_wire.py)."""
    batch = SendBatchRequest(records=(record(), message()))
    check("wire_send_batch", batch.to_frame(9).encode())
    rows = SendBatchResponse(rows=(SendRow(0, 3, 41, "", 8192), SendRow(16, -1, -1, "sequence gap", -1)))
    check("wire_send_batch_answer", rows.reply(batch.to_frame(9)).encode())
    pull = PullRequest(topic="orders", queue_id=3, offset=40, max_msgs=32, suspend_ms=15_000,
                       tag_hashes=(tag_hash("tagA"),), sql="color = 'red'")
    check("wire_pull", pull.to_frame(10).encode())
    page = PullResponse(next_offset=41, max_offset=50, leaderless=False,
                        rows=(PullRow(40, 8192, STORE_MS, record()),
                              PullRow(43, 8400, STORE_MS, record(), (1,))))
    check("wire_pull_answer", page.reply(pull.to_frame(10)).encode())
    moved = NotLeaderResponse(leader="n2", leader_address="10.0.0.12:10911")
    check("wire_not_leader", moved.reply(pull.to_frame(10), ResponseCode.NOT_LEADER, "n1 follows").encode())
    assert PullRequest.from_frame(decode_frame(pull.to_frame(10).encode())) == pull
    assert PullResponse.from_frame(decode_frame(page.reply(pull.to_frame(10)).encode())) == page


def test_commitlog_entry_record_and_blank() -> None:
    record = encode_entry(1_000_001, 7, EntryKind(1), b"payload bytes")
    check("commitlog_entry", record)
    assert decode_entry(record).body == b"payload bytes"
    legacy = bytes.fromhex((GOLDEN / "commitlog_entry_v1.hex").read_text().replace("\n", ""))
    entry = decode_entry(legacy)  # written before MAGIC_ENTRY_V2 (a body-only CRC): still read
    assert (entry.index, entry.term, entry.kind, entry.body) == (1_000_001, 7, EntryKind(1), b"payload bytes")
    check("commitlog_blank", encode_blank(24))


def test_message_and_entry_batch() -> None:
    check("message", message())
    assert decode_message(message()).body == b"hello"
    check("record", record())
    assert [m.body for m in decode_messages(record())] == [b"one", b"two", b"three"]
    assert [m.sequence for m in decode_messages(record())] == [41, 42, 43]
    (payload,) = pack_entries([message(), message()], STORE_MS)
    check("entry_batch", payload)
    batch = unpack_entry(payload)
    assert batch.store_timestamp_ms == STORE_MS and len(batch.messages) == 2


@pytest.mark.parametrize("record", [
    CreateTopic("orders", 8, Perm.READ_WRITE), DeleteTopic("orders"), CommitOffset("g-1", "orders", 3, 99),
    RollbackHalf(4096), CheckHalf(4096, STORE_MS), LockQueue("g-1", "client-1", "orders", 3, True),
    VerifyMarker("5f1e0c2a9b3d4e6f", 1 << 20),
], ids=lambda r: type(r).__name__)
def test_admin_records(record: object) -> None:
    data = encode_admin(record)  # type: ignore[arg-type]
    check(f"admin_{type(record).__name__}", data)
    assert decode_admin(data) == record


def test_consume_queue_unit_and_hashes() -> None:
    check("cq_unit", UNIT.pack(123_456_789, 310, 64, 0, 0, 5, STORE_MS, tag_hash("tagA")))
    hashes = [tag_hash("tagA"), tag_hash(None), key_hash("order-17"),
              cq_hash_step(0, cq_hash_prefix("orders", 3), (123_456_789, 310, 64, 0, 5, STORE_MS,
                                                             tag_hash("tagA")))]
    check("hashes", b"".join(h.to_bytes(16, "big", signed=True) for h in hashes))


def test_index_file(tmp_path: Path) -> None:
    f = IndexFile.create(tmp_path / "idx", 4, 4)
    try:
        f.put("order-17", 4096, STORE_MS)
        f.put("order-18", 8192, STORE_MS + 2500)
        f.flush()
    finally:
        f.close()
    check("index_file", (tmp_path / "idx").read_bytes())


def test_hard_state_slot() -> None:
    slot = encode_slot(7, HardState(term=12, voted_for="10.0.0.12:20001", commit=4096))
    check("hard_state", slot)
    assert decode_slot(slot) == (7, HardState(12, "10.0.0.12:20001", 4096))


def test_snapshot_log_start_and_membership_change() -> None:
    state = {"topics": {"orders": [8, 6]}, "queues": {"orders": {3: 12}},
             "offsets": {"g-1": {"orders": {3: 10}}}, "producers": {}, "timers": {4096: [310, STORE_MS]},
             "halves": {}, "locks": {}, "sent_back": {}, "last_store_ms": STORE_MS, "cq_hash": bytes(16)}
    snap = Snapshot.of(41, state).encode()
    check("snapshot", snap)
    assert Snapshot.decode(snap).index == 41
    change = MEMBERSHIP_PREFIX + encode_change(Change("add", Member("n4", "10.0.0.14:20001",
                                                                    "10.0.0.14:10911")))
    check("membership_change", change)
    assert decode_change(change) == Change("add", Member("n4", "10.0.0.14:20001", "10.0.0.14:10911"))
    dump = encode_log_start(DumpEntry(b"\x00first", 42, 3, 1 << 20),
                            DumpEntry(b"\x00second", 43, 3, (1 << 20) + 64), snap,
                            [Member("n1", "10.0.0.11:20001", "10.0.0.11:10911").member_id])
    check("log_start", dump)
    start = decode_log_start(dump)
    ref = StateRef(41, len(snap), hashlib.sha256(snap).hexdigest())
    assert start.state is None and start.state_ref == ref
    # a leader of the version before names nothing: it sends the snapshot inline (still read)
    v2 = decode_log_start(bytes.fromhex("".join((GOLDEN / "log_start_v2.hex").read_text().split())))
    # (its inline snapshot is of the snapshot format before: the bytes as they were sent)
    assert v2.state is not None and v2.state_ref is None and v2.first == start.first


def test_every_sample_is_used() -> None:
    """A sample nobody checks any more is a format that silently went away."""
    names = {p.stem for p in GOLDEN.glob("*.hex")}
    expected = {"frame_request", "frame_response", "commitlog_entry", "commitlog_entry_v1", "commitlog_blank",
                "message", "record",
                "wire_send_batch", "wire_send_batch_answer", "wire_pull", "wire_pull_answer",
                "wire_not_leader",
                "entry_batch", "cq_unit", "hashes", "index_file", "snapshot", "membership_change",
                "log_start", "log_start_v2", "hard_state"}
    expected |= {f"admin_{n}" for n in ("CreateTopic", "DeleteTopic", "CommitOffset", "RollbackHalf",
                                         "CheckHalf", "LockQueue", "VerifyMarker")}
    if WRITE:
        return
    assert names == expected
