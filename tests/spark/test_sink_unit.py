"""The ``raftmq`` sink without Spark or brokers: options, rows to messages, and the
partition writer against a fake leader -- what it sends is a function of the rows only
(queues, record boundaries, sequences, ids), one request per queue at a time."""

from __future__ import annotations

import asyncio
from itertools import pairwise
from typing import Any

import pyarrow as pa
import pytest

from client.queues import MessageQueue, shard_index
from protocol.record_batch import decode_messages, read_header
from protocol.send import SendBatchRequest, SendBatchResponse, SendRow
from spark.options import OptionError
from spark.sink_options import parse_sink_options
from spark.sink_writer import _PartitionWriter, rows_of

pytestmark = pytest.mark.spark


def test_options_need_one_cluster_and_check_limits() -> None:
    with pytest.raises(OptionError, match="namesrv"):
        parse_sink_options({"topic": "t"})
    with pytest.raises(OptionError, match="requestMessages"):
        parse_sink_options({"servers": "127.0.0.1:1", "requestMessages": "4096"})
    with pytest.raises(OptionError, match="topic"):
        parse_sink_options({"servers": "127.0.0.1:1", "topic": "bad topic!"})
    opts = parse_sink_options({"Servers": "127.0.0.1:1,127.0.0.1:2", "writeTimeoutMs": "5000",
                               "user": "u", "password": "secret"})
    assert opts.topic is None and opts.servers == ("127.0.0.1:1", "127.0.0.1:2")
    assert opts.write_timeout_s == 5.0 and "secret" not in repr(opts)


def test_rows_become_messages_with_every_column() -> None:
    batch = pa.RecordBatch.from_pylist(
        [{"topic": "t1", "body": "x", "tags": "a", "keys": ["k1", "k2"], "properties": {"p": "1"},
          "shard_key": "s", "deliver_at_ms": 123, "delay_level": None, "other": 5},
         {"topic": "t2", "body": "y", "tags": None, "keys": None, "properties": None,
          "shard_key": None, "deliver_at_ms": None, "delay_level": 3, "other": 6}],
        schema=pa.schema([("topic", pa.string()), ("body", pa.string()), ("tags", pa.string()),
                          ("keys", pa.list_(pa.string())), ("properties", pa.map_(pa.string(), pa.string())),
                          ("shard_key", pa.string()), ("deliver_at_ms", pa.int64()),
                          ("delay_level", pa.int32()), ("other", pa.int64())]))
    (m1, k1), (m2, k2) = rows_of(batch, None)
    assert (m1.topic, m1.body, m1.tags, tuple(m1.keys), dict(m1.properties), m1.deliver_at_ms, k1) == \
        ("t1", b"x", "a", ("k1", "k2"), {"p": "1"}, 123, "s")
    assert (m2.topic, m2.body, m2.tags, tuple(m2.keys), dict(m2.properties), m2.delay_level, k2) == \
        ("t2", b"y", None, (), {}, 3, None)
    assert [m.topic for m, _ in rows_of(batch, "forced")] == ["forced", "forced"]  # the option wins
    with pytest.raises(ValueError, match="column body"):
        list(rows_of(pa.record_batch({"value": [b"1"]}), "t"))


class _Route:
    def __init__(self, queues: list[MessageQueue]) -> None:
        self._queues = queues

    def queues(self, perm: int) -> list[MessageQueue]:
        return list(reversed(self._queues))  # the writer sorts them


class _Routes:
    def __init__(self, queues: list[MessageQueue]) -> None:
        self.route_of = _Route(queues)

    async def route(self, topic: str, refresh: bool = False) -> _Route:
        return self.route_of


class FakeLeader:
    """Answers every message SUCCESS; records what was sent, and how many requests of a
    queue were in flight at once."""

    def __init__(self, queues: int) -> None:
        self.routes = _Routes([MessageQueue("t", "g1", q) for q in range(queues)])
        self.sent: list[bytes] = []
        self.busy: dict[int, int] = {}
        self.most_busy = 0

    async def leader_request(self, group: str, request: SendBatchRequest, **kw: Any) -> Any:
        qid = read_header(request.records[0]).queue_id
        self.busy[qid] = self.busy.get(qid, 0) + 1
        self.most_busy = max(self.most_busy, self.busy[qid])
        await asyncio.sleep(0)
        self.sent.extend(request.records)
        self.busy[qid] -= 1
        count = sum(read_header(r).count for r in request.records)
        return _Answer(SendBatchResponse(rows=tuple(SendRow(0, qid, 0, "") for _ in range(count))))


class _Answer:
    def __init__(self, response: SendBatchResponse) -> None:
        self.response = response


def _write(batch: pa.RecordBatch, request_messages: int, monkeypatch: pytest.MonkeyPatch) -> FakeLeader:
    leader = FakeLeader(4)
    monkeypatch.setattr(SendBatchResponse, "from_frame", classmethod(lambda cls, frame: frame.response))
    opts = parse_sink_options({"servers": "127.0.0.1:1", "topic": "t",
                               "requestMessages": str(request_messages)})

    async def run() -> None:
        writer = _PartitionWriter(leader, opts, "spark/q/7/1")  # type: ignore[arg-type]
        for m, key in rows_of(batch, "t"):
            await writer.add(m, key)
        await writer.finish()
        assert writer.summary.rows == batch.num_rows

    asyncio.run(run())
    return leader


def _layout(leader: FakeLeader) -> list[tuple[int, int, int, str | None, list[bytes]]]:
    out = []
    for r in leader.sent:
        h = read_header(r)
        out.append((h.queue_id, h.base_sequence, h.count, h.producer_id, h.msg_ids(r)))
    return sorted(out, key=lambda x: (x[0], x[1]))


def test_a_second_write_of_the_same_rows_sends_the_same_records(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 3000
    batch = pa.record_batch({"body": [f"{i:05d}".encode() * 40 for i in range(n)],
                             "shard_key": [None if i % 3 == 0 else f"key{i % 11}" for i in range(n)],
                             "delay_level": [2 if i == 1500 else None for i in range(n)]})
    first, again = _write(batch, 200, monkeypatch), _write(batch, 200, monkeypatch)
    assert _layout(first) == _layout(again)
    assert first.most_busy == 1, "more than one request of a queue in flight"
    layout = _layout(first)
    assert {p for _, _, _, p, _ in layout} == {"spark/q/7/1"}
    for qid in {q for q, *_ in layout}:  # sequences 0, 1, 2 ... without a gap per queue
        seqs = [(b, c) for q, b, c, _, _ in layout if q == qid]
        assert seqs[0][0] == 0 and all(b2 == b1 + c1 for (b1, c1), (b2, _) in pairwise(seqs))
    assert sum(c for _, _, c, _, _ in layout) == n
    assert all(len(r) <= 48 * 1024 + 1024 for r in first.sent)  # records of about 48 KiB at most
    delayed = [r for r in first.sent if read_header(r).special]
    assert len(delayed) == 1 and read_header(delayed[0]).count == 1
    # keyed rows went to their key's queue, in row order
    bodies: dict[int, list[bytes]] = {}
    for r in sorted(first.sent, key=lambda r: (read_header(r).queue_id, read_header(r).base_sequence)):
        bodies.setdefault(read_header(r).queue_id, []).extend(m.body for m in decode_messages(r))
    for i in range(1, n, 3):
        key = f"key{i % 11}"
        assert f"{i:05d}".encode() * 40 in bodies[shard_index(key, 4)]
