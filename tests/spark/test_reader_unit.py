"""The ``raftmq`` source without Spark and without a cluster: options, planning, admission
control, decoding to Arrow, and the partition reader against fake replicas that
misbehave (a gap, a crash, a lag, retention)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from client.credentials import Credentials
from client.errors import ClientError
from protocol.pull import PullRow
from spark.arrow import ARROW_SCHEMA, to_record_batch
from spark.errors import DataLossError, RangeMismatchError, ReadError, ReplicaUnavailableError
from spark.options import EARLIEST, LATEST, OptionError, parse_options
from spark.pages import decode_page
from spark.planning import (
    QueueBounds,
    QueueRange,
    admit,
    offsets_from_json,
    offsets_to_json,
    plan_batch,
    plan_ranges,
)
from spark.range_reader import read_columns
from spark.replicas import read_order
from tests.spark.fake_broker import QUEUE, TOPIC, FakeReplica, link, make_messages

pytestmark = [pytest.mark.spark]


# -- options --------------------------------------------------------------------------------
def test_options_defaults_and_checks() -> None:
    o = parse_options({"servers": "a:1, b:2,c:3", "topic": "orders"})
    assert o.servers == ("a:1", "b:2", "c:3") and o.read_from == "follower" and o.starting is None
    assert o.ending.kind == "latest" and o.max_records_per_trigger is None and o.tags is None
    o = parse_options({"NAMESRV": "ns:9876", "Topic": "x", "READFROM": "Any", "tags": "a || b",
                       "maxRecordsPerTrigger": "500"})
    assert o.namesrv == ("ns:9876",) and o.read_from == "any" and o.max_records_per_trigger == 500
    assert o.selector().tags == frozenset({"a", "b"})
    assert parse_options({"servers": "a:1", "topic": "x", "tags": "*"}).tags is None
    for bad, what in [({"servers": "a:1"}, "topic"), ({"topic": "x"}, "namesrv"),
                      ({"topic": "x", "servers": "a:1", "namesrv": "n:1"}, "exactly one"),
                      ({"topic": "x", "servers": "a:1", "readFrom": "primary"}, "readFrom"),
                      ({"topic": "x", "servers": "a:1", "maxRecordsPerTrigger": "0"}, "maxRecordsPerTrigger"),
                      ({"topic": "x", "servers": "a:1", "pullBatch": "2000"}, "at most 1024"),
                      ({"topic": "x", "servers": "a:1", "tags": "||"}, "tags"),
                      ({"topic": "x", "servers": "a:1", "startingOffsets": "soon"}, "startingOffsets")]:
        with pytest.raises(OptionError, match=what):
            parse_options(bad)


def test_credentials_options(tmp_path) -> None:  # type: ignore[no-untyped-def]
    o = parse_options({"servers": "a:1", "topic": "x", "user": "reader", "password": "pw"})
    assert o.credentials() == Credentials("reader", "pw")
    assert o.client_args()["credentials"] == o.credentials()
    assert "pw" not in repr(o)
    (tmp_path / "creds").write_text("reader2\npw2\n")
    assert parse_options({"servers": "a:1", "topic": "x", "credentialsFile": str(tmp_path / "creds")}
                         ).credentials() == Credentials("reader2", "pw2")
    assert parse_options({"servers": "a:1", "topic": "x"}).credentials() is None
    with pytest.raises(OptionError, match="together"):
        parse_options({"servers": "a:1", "topic": "x", "user": "reader"})


def test_offset_specs() -> None:
    def spec(v: str):  # type: ignore[no-untyped-def]
        return parse_options({"servers": "a:1", "topic": "x", "startingOffsets": v}).starting

    assert spec("EARLIEST").kind == "earliest" and spec("latest").kind == "latest"
    assert spec("1700000000000").timestamp_ms == 1_700_000_000_000
    when = int(datetime(2026, 5, 1, 12, tzinfo=UTC).timestamp() * 1000)
    assert spec("2026-05-01T12:00:00Z").timestamp_ms == when
    assert spec("2026-05-01T12:00:00").timestamp_ms == when  # no zone: UTC
    s = spec('{"g1": {"0": 5, "3": -2}, "g2": {"1": -1}}')
    assert s.kind == "queues" and s.for_queue("x", "g1", 0) == 5 and s.for_queue("x", "g1", 3) == EARLIEST
    assert s.for_queue("x", "g2", 1) == LATEST and s.for_queue("x", "g1", 1) is None
    for bad in ('{"g1": 5}', '{"g1": {"x": 1}}', '{"g1": {"0": -3}}', '{"g1": {"0": "1"}}', "{nope"):
        with pytest.raises(OptionError):
            spec(bad)


# -- replicas and planning --------------------------------------------------------------------
def test_read_order_never_uses_the_leader_for_follower_reads() -> None:
    roles = {"a": "leader", "b": "follower", "c": "candidate", "d": None}
    assert read_order(roles, "follower") == ["b", "c"]
    assert read_order(roles, "follower", preferred="c") == ["c", "b"]
    assert read_order(roles, "any") == ["b", "c", "a"]
    assert read_order(roles, "leader") == ["a", "b", "c"]
    only_leader = {"a": "leader", "b": None, "c": None}
    assert read_order(only_leader, "follower") == []
    assert read_order(only_leader, "any") == ["a"]


def _bounds(group: str, qid: int, low: int, high: int,
            sources: tuple[str, ...] = ("f1", "f2")) -> QueueBounds:
    return QueueBounds("t", group, qid, low, high, ("l", "f1", "f2"), sources)


def test_plan_ranges_splits_evenly_and_alternates_followers() -> None:
    bounds = [_bounds("g1", 0, 0, 250), _bounds("g1", 1, 0, 0), _bounds("g1", 2, 10, 60)]
    ranges = plan_ranges(bounds, {b.key: b.low for b in bounds}, {b.key: b.high for b in bounds}, 100)
    assert [(r.queue_id, r.start, r.end) for r in ranges] == [(0, 0, 84), (0, 84, 168), (0, 168, 250),
                                                               (2, 10, 60)]
    assert [r.preferred for r in ranges] == ["f1", "f2", "f1", "f2"]
    assert sum(r.count for r in ranges) == 300


def test_admit_is_fair_bounded_and_makes_progress() -> None:
    start = {("g", 0): 0, ("g", 1): 100, ("g", 2): 5}
    available = {("g", 0): 1000, ("g", 1): 110, ("g", 2): 5, ("g", 3): 50}  # queue 3 is new: no backlog
    end = admit(start, available, 300)
    assert end[("g", 1)] == 110 and end[("g", 2)] == 5 and end[("g", 3)] == 50
    assert end[("g", 0)] == 290  # what queue 1 left goes to queue 0
    assert sum(end[k] - start.get(k, available[k]) for k in available) == 300
    tiny = admit({("g", i): 0 for i in range(4)}, {("g", i): 10 for i in range(4)}, 2)
    assert sum(tiny.values()) == 2
    assert admit(start, available, 300) == end  # deterministic


def test_offsets_json_round_trip_is_ordered() -> None:
    offsets = {("t", "g2", 0): 3, ("t", "g1", 10): 7, ("t", "g1", 2): 1}
    doc = offsets_to_json(offsets, "t")
    assert list(doc) == ["g1", "g2"] and list(doc["g1"]) == ["2", "10"]
    assert offsets_from_json(doc, "t") == offsets


def test_offsets_json_of_one_topic_keeps_the_old_shape_and_several_are_keyed_by_topic() -> None:
    # a checkpoint written before several topics were read: {"<group>": {"<queue id>": offset}}
    old = json.loads('{"g1": {"0": 5, "3": 7}, "g2": {"1": 9}}')
    offsets = offsets_from_json(old, "orders")
    assert offsets == {("orders", "g1", 0): 5, ("orders", "g1", 3): 7, ("orders", "g2", 1): 9}
    assert json.dumps(offsets_to_json(offsets, "orders")) == json.dumps(old)  # the same text
    several = {("returns", "g1", 0): 4, ("orders", "g2", 10): 8, ("orders", "g2", 2): 6,
               ("orders", "g1", 0): 5}
    doc = offsets_to_json(several, None)
    assert json.dumps(doc) == ('{"orders": {"g1": {"0": 5}, "g2": {"2": 6, "10": 8}}, '
                               '"returns": {"g1": {"0": 4}}}')
    assert offsets_from_json(json.loads(json.dumps(doc)), None) == several
    # a query switched between topic and topics / topicPattern is refused, not misread
    with pytest.raises(ReadError, match="new checkpoint"):
        offsets_from_json(old, None)
    with pytest.raises(ReadError, match="new checkpoint"):
        offsets_from_json(doc, "orders")
    with pytest.raises(ReadError, match="one topic"):
        offsets_to_json(several, "orders")


def test_topic_topics_and_topic_pattern_options() -> None:
    base = {"servers": "a:1"}
    one = parse_options({**base, "topic": "orders"})
    assert (one.topic, one.topics, one.topic_pattern, one.single_topic) == ("orders", (), None, "orders")
    many = parse_options({**base, "topics": " orders, returns,,orders "})
    assert (many.topic, many.topics, many.single_topic) == ("", ("orders", "returns"), None)
    assert many.matches("returns") and not many.matches("orders2")
    pat = parse_options({**base, "TopicPattern": "ord.*s"})
    assert pat.topic_pattern == "ord.*s" and pat.single_topic is None
    assert pat.matches("orders") and not pat.matches("orders-eu") and not pat.matches("my-orders")  # in full
    assert "topicPattern='ord.*s'" in repr(pat)
    for bad, what in [({}, "exactly one of the options topic"),
                      ({"topic": "a", "topics": "b"}, r"got topic, topics"),
                      ({"topics": "a", "topicPattern": "b"}, r"got topics, topicPattern"),
                      ({"topics": " , "}, "exactly one"),
                      ({"topicPattern": "ord(ers"}, r"option topicPattern: 'ord\(ers' is not a regular"),
                      ({"topics": "ok,bad name"}, "option topics"),
                      ({"topics": "a,b", "startingOffsets": '{"g1": {"0": 5}}'}, '"<topic>"'),
                      ({"topics": "a,b", "startingOffsets": '{"c": {"g1": {"0": 5}}}'}, "topic 'c'"),
                      ({"topicPattern": "a.*", "endingOffsets": '{"b": {"g1": {"0": 5}}}'}, "topicPattern"),
                      ({"topics": "a", "startingOffsetsByTimestamp": '{"b": {"g1": {"0": 5}}}'},
                       "startingOffsetsByTimestamp names topic 'b'"),
                      ({"topic": "a", "startingOffsets": '{"a": {"g1": {"0": 5}}}'}, "is not a queue id")]:
        with pytest.raises(OptionError, match=what):
            parse_options({**base, **bad})
    spec = parse_options({**base, "topicPattern": "a.*",
                          "startingOffsets": '{"ab": {"g1": {"0": 5}}, "a": {"g2": {"1": -1}}}'}).starting
    assert spec is not None and spec.queues == ((("a", "g2", 1), LATEST), (("ab", "g1", 0), 5))
    assert spec.for_queue("ab", "g1", 0) == 5 and spec.for_queue("a", "g1", 0) is None


# -- decoding -------------------------------------------------------------------------------
def test_decode_page_to_arrow() -> None:
    msgs = make_messages(5)
    raw = [PullRow(i, 1000 + i, 1_700_000_100_000 + i, msgs[i][0]) for i in range(5)]
    rng = QueueRange(TOPIC, "g1", QUEUE, 0, 5, ("x",))
    cols = decode_page(raw, rng, None)
    assert cols.queue_offset == [0, 1, 2, 3, 4] and cols.body[3] == b"m3" and cols.tags[2] is None
    assert cols.keys[1] == ("k1",) and cols.properties[4] == {"i": "4"} and len(cols.msg_id[0]) == 32
    batch = to_record_batch(cols)
    assert batch.schema.equals(ARROW_SCHEMA) and batch.num_rows == 5
    row = batch.to_pylist()[1]
    assert row["topic"] == TOPIC and row["broker_group"] == "g1" and row["queue_offset"] == 1
    assert row["store_timestamp"] == datetime.fromtimestamp(1_700_000_100.001, UTC)
    assert row["born_timestamp"] == datetime.fromtimestamp(1_700_000_000.001, UTC)
    assert row["properties"] == [("i", "1")] and row["keys"] == ["k1"]
    filtered = decode_page(raw, rng, frozenset({"a"}))
    assert filtered.queue_offset == [0, 3]
    other = QueueRange(TOPIC, "g1", 1, 0, 5, ("x",))
    with pytest.raises(RangeMismatchError, match="queue"):
        decode_page(raw, other, None)
    assert to_record_batch(decode_page([], rng, None)).num_rows == 0
    assert isinstance(to_record_batch(cols).column(6), pa.TimestampArray)


def test_arrow_batch_of_records_is_each_message_as_decoded_one_by_one() -> None:
    from protocol.record_batch import decode_messages, encode_record
    rng = QueueRange(TOPIC, "g1", QUEUE, 3, 12, ("x",))
    for props in ({}, {"p": "v"}):  # no message with properties: empty maps made in bulk
        records = [encode_record(TOPIC, QUEUE, [(bytes([o]) * 16, 1_700_000_000_000 + 7 * o, 0,
                                                 "t" if o % 2 else None, (f"k{o}",), props, 0, b"b%d" % o)
                                                for o in range(base, base + 5)])
                   for base in (0, 5, 10)]
        raw = [PullRow(base, 100 + base, -1 if base == 5 else 1_700_000_100_000, rec)
               for base, rec in zip((0, 5, 10), records, strict=True)]
        got = to_record_batch(decode_page(raw, rng, None, 3)).to_pylist()
        want = [(base + i, m) for base, rec in zip((0, 5, 10), records, strict=True)
                for i, m in enumerate(decode_messages(rec)) if 3 <= base + i < 12]
        assert [r["queue_offset"] for r in got] == [o for o, _ in want]
        assert [r["commit_log_offset"] for r in got] == [100 + o for o, _ in want]
        assert [r["msg_id"] for r in got] == [m.msg_id.hex() for _, m in want]
        assert [r["born_timestamp"] for r in got] == [datetime.fromtimestamp(m.born_ts_ms / 1000, UTC)
                                                      for _, m in want]
        assert [r["store_timestamp"] is None for r in got] == [5 <= o < 10 for o, _ in want]  # -1: null
        assert [(r["keys"], r["tags"], dict(r["properties"]), r["body"]) for r in got] == \
            [(list(m.keys), m.tags, m.properties, m.body) for _, m in want]


def test_spark_schema_is_the_arrow_schema_spark_checks_batches_against() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    from spark.arrow import COLUMNS
    from spark.datasource import SCHEMA
    assert to_arrow_schema(SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)
    assert [f.name for f in SCHEMA.fields] == [name for name, _ in COLUMNS]


def test_a_compressed_record_of_many_is_split_from_where_the_range_starts() -> None:
    from protocol.record_batch import encode_record
    body = b"x" * 10_000
    entries = [(bytes([i]) * 16, 5, 0, "a", (), {}, 0, body + bytes([i])) for i in range(6)]
    data = encode_record(TOPIC, QUEUE, entries, compression="zstd")
    assert len(data) < 2_000
    rng = QueueRange(TOPIC, "g1", QUEUE, 0, 10, ("x",))
    cols = decode_page([PullRow(4, 900, 7, data)], rng, None, start=6, end=9)
    assert cols.queue_offset == [6, 7, 8] and cols.commit_log_offset == [902, 903, 904]
    assert cols.body == [body + bytes([i]) for i in (2, 3, 4)] and cols.store_ms == [7, 7, 7]


def test_import_spark_does_not_import_pyspark() -> None:
    code = ("import sys, spark, spark.errors, spark.options, spark.pages, spark.planning, "
            "spark.range_reader, spark.replicas; "
            "assert 'pyspark' not in sys.modules, 'pyspark imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- the partition reader against fake replicas ------------------------------------------------------
def _group(records_of: int) -> Iterator[dict[str, FakeReplica]]:
    """A leader and two followers over 1,000 messages in records of ``records_of``."""
    msgs = make_messages(1000)
    group = {"leader": FakeReplica(msgs, role="leader", records_of=records_of).start(),
             "f1": FakeReplica(msgs, records_of=records_of).start(),
             "f2": FakeReplica(msgs, records_of=records_of).start()}
    link(group)
    try:
        yield group
    finally:
        for r in group.values():
            r.stop()


@pytest.fixture
def replicas() -> Iterator[dict[str, FakeReplica]]:
    yield from _group(1)


@pytest.fixture
def record_replicas() -> Iterator[dict[str, FakeReplica]]:
    """The queue stored in records of 7 messages (pulls of 100 end inside them)."""
    yield from _group(7)


def _waits_for_f1_to_reach_the_end(group: dict[str, FakeReplica], applied: int, **options: str) -> None:
    """Both followers applied ``applied`` only, f1 all after 0.7 s: the read waits and is whole."""
    for name in ("f1", "f2"):
        group[name].applied = applied
    timer = threading.Timer(0.7, lambda: setattr(group["f1"], "applied", None))
    timer.start()
    try:
        assert _read(group, **options) == list(range(1000))
    finally:
        timer.cancel()


def _read(replicas: dict[str, FakeReplica], start: int = 0, end: int = 1000, preferred: str = "f1",
          **options: str) -> list[int]:
    opts = parse_options({"servers": replicas["leader"].address, "topic": TOPIC, "followerWaitMs": "3000",
                          **options})
    rng = QueueRange(TOPIC, "g1", QUEUE, start, end, tuple(r.address for r in replicas.values()),
                     replicas[preferred].address)
    out: list[int] = []
    for cols in read_columns(opts, rng, 300):
        out += cols.queue_offset
    return out


def test_reads_exactly_the_range_from_the_preferred_follower(replicas: dict[str, FakeReplica]) -> None:
    assert _read(replicas, 17, 999, preferred="f2") == list(range(17, 999))
    assert replicas["f2"].rows_served == 999 - 17
    assert replicas["leader"].pulls == 0 and replicas["f1"].pulls == 0
    assert _read(replicas, 5, 5) == []


def test_a_gap_fails_the_partition(replicas: dict[str, FakeReplica]) -> None:
    replicas["f1"].skip_offset = 300
    with pytest.raises(RangeMismatchError, match=r"pull at 0 with records that do not follow one another"):
        _read(replicas)


def test_a_follower_dying_mid_read_hands_over_to_the_other(replicas: dict[str, FakeReplica]) -> None:
    replicas["f1"].die_after_pulls = 2
    assert _read(replicas, pullBatch="100", pipeline="1") == list(range(1000))
    assert replicas["f1"].rows_served == 200 and replicas["f2"].rows_served == 800
    assert replicas["leader"].pulls == 0


def test_a_replica_answering_errors_is_left_for_another(replicas: dict[str, FakeReplica]) -> None:
    from protocol.remoting import ResponseCode

    replicas["f1"].error_code = ResponseCode.SYSTEM_ERROR
    assert _read(replicas) == list(range(1000))
    assert replicas["f2"].rows_served == 1000 and replicas["leader"].pulls == 0
    replicas["f2"].error_code = ResponseCode.SYSTEM_ERROR
    started = time.monotonic()
    with pytest.raises(ReadError, match=r"no replica served a pull for 1 s.*SYSTEM_ERROR"):
        _read(replicas, followerWaitMs="1000")
    assert time.monotonic() - started < 10 and replicas["leader"].pulls == 0


def test_a_replica_refusing_large_pulls_is_read_at_its_limit(
        replicas: dict[str, FakeReplica], caplog: pytest.LogCaptureFixture) -> None:
    """A broker from before pulls of 1,024 (it takes 256) answers INVALID_ARGUMENT naming its
    limit: the reader goes on at that limit, from the same replica, and says so once."""
    replicas["f1"].max_pull = 256
    with caplog.at_level("WARNING", logger="spark.raftmq"):
        assert _read(replicas) == list(range(1000))
    assert replicas["f1"].rows_served == 1000 and replicas["f2"].pulls == 0
    assert sum("takes pulls of at most 256" in r.getMessage() for r in caplog.records) == 1


def test_no_follower_up_fails_unless_any(replicas: dict[str, FakeReplica]) -> None:
    replicas["f1"].kill()
    replicas["f2"].kill()
    started = time.monotonic()
    with pytest.raises(ReplicaUnavailableError, match="readFrom=any"):
        _read(replicas, followerWaitMs="1000")
    assert time.monotonic() - started < 10
    assert replicas["leader"].pulls == 0
    assert _read(replicas, readFrom="any") == list(range(1000))
    assert replicas["leader"].rows_served == 1000


def test_a_lagging_follower_is_waited_for(replicas: dict[str, FakeReplica]) -> None:
    _waits_for_f1_to_reach_the_end(replicas, 600)
    replicas["f1"].applied = 600
    with pytest.raises(ReplicaUnavailableError, match="no replica had offset 600"):
        _read(replicas, followerWaitMs="1500")


def test_pipelined_stripes_ship_every_record_of_the_range_once(
        record_replicas: dict[str, FakeReplica]) -> None:
    f1 = record_replicas["f1"]
    assert _read(record_replicas, 3, 997, pullBatch="100", pipeline="3") == list(range(3, 997))
    assert f1.shipped == list(range(0, 997, 7))  # each record once, in order, none past the range
    f1.shipped.clear()
    f1.stripes = False  # a broker that ignores stripes: records come twice, the reader drops the copy
    assert _read(record_replicas, 3, 997, pullBatch="100", pipeline="3") == list(range(3, 997))
    assert sorted(set(f1.shipped)) == list(range(0, 997, 7)) and len(f1.shipped) > len(set(f1.shipped))


def test_a_stripe_past_a_lagging_replica_end_is_waited_for(record_replicas: dict[str, FakeReplica]) -> None:
    # the pull at 0 ends at 105 (the record [98, 105)); the stripe [100, 200) finds no record
    # starting in it that the replica applied: an empty page short of the stripe, not a mismatch
    _waits_for_f1_to_reach_the_end(record_replicas, 105, pullBatch="100", pipeline="2")
    assert record_replicas["leader"].pulls == 0


def test_retention_is_reported_as_data_loss(replicas: dict[str, FakeReplica]) -> None:
    replicas["f1"].min_offset = 100
    with pytest.raises(DataLossError, match=r"\[0, 100\)"):
        _read(replicas)


def test_fail_on_data_loss_false_skips_what_retention_removed_and_says_how_many(
        replicas: dict[str, FakeReplica], caplog: pytest.LogCaptureFixture) -> None:
    replicas["f1"].min_offset = 100
    replicas["f2"].min_offset = 100
    with caplog.at_level("WARNING", logger="spark.raftmq"):
        got = _read(replicas, failOnDataLoss="false")
    assert got == list(range(100, 1000))
    assert "100 messages skipped (failOnDataLoss=false)" in caplog.text
    with pytest.raises(OptionError, match="failOnDataLoss"):
        parse_options({"servers": "127.0.0.1:1", "topic": "t", "failOnDataLoss": "maybe"})


def test_a_json_start_before_retention_starts_at_the_earliest_without_fail_on_data_loss() -> None:
    from spark.planning import _resolve

    b = QueueBounds(TOPIC, "g1", QUEUE, 100, 500, ("x",), ("x",))
    spec = parse_options({"servers": "127.0.0.1:1", "topic": "t",
                          "startingOffsets": json.dumps({"g1": {str(QUEUE): 40}})}).starting
    assert spec is not None
    with pytest.raises(DataLossError, match="no longer retained"):
        _resolve(spec, b, EARLIEST, "startingOffsets")
    assert _resolve(spec, b, EARLIEST, "startingOffsets", fail_on_data_loss=False) == (100, True)


def test_tag_filter_covers_the_range_without_gaps(replicas: dict[str, FakeReplica]) -> None:
    got = _read(replicas, 10, 990, tags="a || b", pullBatch="64")
    assert got == [i for i in range(10, 990) if i % 3 != 2]
    assert replicas["leader"].pulls == 0


def test_plan_takes_the_lowest_end_among_followers_and_never_asks_the_leader(
        replicas: dict[str, FakeReplica]) -> None:
    replicas["f1"].applied, replicas["f2"].applied = 800, 900
    servers = ",".join(r.address for r in replicas.values())
    ranges = plan_batch(parse_options({"servers": servers, "topic": TOPIC, "maxRecordsPerPartition": "300"}))
    assert [(r.start, r.end) for r in ranges] == [(0, 267), (267, 534), (534, 800)]
    first, second = sorted(replicas[n].address for n in ("f1", "f2"))
    assert [r.preferred for r in ranges] == [first, second, first]  # the followers in turn
    assert replicas["leader"].searches == 0 and replicas["f1"].searches == replicas["f2"].searches == 1
    ranges = plan_batch(parse_options({"servers": servers, "topic": TOPIC, "readFrom": "leader"}))
    assert [(r.start, r.end, r.preferred) for r in ranges] == [(0, 1000, replicas["leader"].address)]
    replicas["f2"].kill()
    ranges = plan_batch(parse_options({"servers": servers, "topic": TOPIC,
                                       "endingOffsets": '{"g1": {"0": 850}}'}))
    assert [(r.start, r.end, r.preferred) for r in ranges] == [(0, 850, replicas["f1"].address)]
    replicas["f1"].kill()
    with pytest.raises(ReplicaUnavailableError, match="readFrom=any"):
        plan_batch(parse_options({"servers": servers, "topic": TOPIC, "followerWaitMs": "500"}))


def test_plan_reads_several_topics_listed_or_matched_in_full(replicas: dict[str, FakeReplica]) -> None:
    for r in replicas.values():
        r.topics = {"t2": 40, "t-other": 7, "x": 3}
    servers = ",".join(r.address for r in replicas.values())

    def plan(**options: str) -> list[tuple[str, int, int]]:
        return [(r.topic, r.start, r.end) for r in plan_batch(parse_options({"servers": servers, **options}))]

    assert plan(topics="t,t2") == [(TOPIC, 0, 1000), ("t2", 0, 40)]
    assert plan(topicPattern="t.?") == [(TOPIC, 0, 1000), ("t2", 0, 40)]  # not t-other: matched in full
    assert plan(topicPattern="t.*", maxRecordsPerPartition="600") == \
        [(TOPIC, 0, 500), (TOPIC, 500, 1000), ("t-other", 0, 7), ("t2", 0, 40)]
    assert plan(topicPattern="nothing.*") == []  # no topic matches (yet): nothing to read
    assert plan(topics="t2,x", startingOffsets='{"t2": {"g1": {"0": 30}}}',
                endingOffsets='{"x": {"g1": {"0": 2}}}') == [("t2", 30, 40), ("x", 0, 2)]
    with pytest.raises(ClientError, match="nope"):
        plan(topics="t2,nope")  # a listed topic must exist, as the one topic must
    assert replicas["leader"].searches == 0


def test_stream_with_a_topic_pattern_takes_a_new_topic_from_its_earliest_offset(
        replicas: dict[str, FakeReplica]) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from spark.datasource import RaftMQStreamReader

    for r in replicas.values():
        r.topics = {"t2": 40, "u": 5}
    servers = ",".join(r.address for r in replicas.values())
    r = RaftMQStreamReader(parse_options({"servers": servers, "topicPattern": "t.*"}))
    start = r.initialOffset()
    assert start == {TOPIC: {"g1": {"0": 1000}}, "t2": {"g1": {"0": 40}}}  # latest, keyed by topic
    for rep in replicas.values():
        rep.topics = {"t2": 45, "u": 5, "t3": 25}  # t3 created while the query runs
    end = r.latestOffset(start, ReadAllAvailable())
    assert end == {TOPIC: {"g1": {"0": 1000}}, "t2": {"g1": {"0": 45}}, "t3": {"g1": {"0": 0}}}
    assert [(p.rng.topic, p.rng.start, p.rng.end) for p in r.partitions(start, end)] == [("t2", 40, 45)]  # type: ignore[attr-defined]
    for rep in replicas.values():
        rep.topics = {"t3": 25}  # t2 deleted: it keeps its offsets
    later = r.latestOffset(end, ReadAllAvailable())
    assert later == {TOPIC: {"g1": {"0": 1000}}, "t2": {"g1": {"0": 45}}, "t3": {"g1": {"0": 25}}}
    assert [(p.rng.topic, p.rng.start, p.rng.end) for p in r.partitions(end, later)] == [("t3", 0, 25)]  # type: ignore[attr-defined]
    # a pattern nothing matches yet: no offsets, then the first matching topic from its earliest
    none_yet = RaftMQStreamReader(parse_options({"servers": servers, "topicPattern": "v.*"}))
    assert none_yet.initialOffset() == {}
    assert none_yet.latestOffset({}, ReadAllAvailable()) == {}
    for rep in replicas.values():
        rep.topics = {"v1": 12}
    assert none_yet.latestOffset({}, ReadAllAvailable()) == {"v1": {"g1": {"0": 0}}}
    assert none_yet.latestOffset({"v1": {"g1": {"0": 0}}}, ReadAllAvailable()) == {"v1": {"g1": {"0": 12}}}


def test_stream_offsets_never_go_back_admit_and_stop_at_the_available_now_target(
        replicas: dict[str, FakeReplica]) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from spark.datasource import RaftMQStreamReader

    servers = ",".join(r.address for r in replicas.values())
    r = RaftMQStreamReader(parse_options({"servers": servers, "topic": TOPIC, "maxRecordsPerTrigger": "100"}))
    assert r.reportLatestOffset() is None  # nothing planned yet
    assert r.initialOffset() == {"g1": {"0": 1000}}  # latest by default
    assert r.getDefaultReadLimit() == ReadMaxRows(100)
    start = {"g1": {"0": 10}}
    assert r.latestOffset(start, ReadMaxRows(100)) == {"g1": {"0": 110}}
    assert r.reportLatestOffset() == {"g1": {"0": 1000}}  # the progress's latestOffset: lag 890
    assert r.latestOffset(start, ReadAllAvailable()) == {"g1": {"0": 1000}}
    for name in ("f1", "f2"):
        replicas[name].applied = 500
    assert r.latestOffset({"g1": {"0": 700}}, ReadAllAvailable()) == {"g1": {"0": 700}}  # never back
    r.prepareForTriggerAvailableNow()  # the target: 500
    for name in ("f1", "f2"):
        replicas[name].applied = None  # 1000 now
    assert r.latestOffset(start, ReadAllAvailable()) == {"g1": {"0": 500}}
    assert r.latestOffset({}, ReadAllAvailable()) == {"g1": {"0": 0}}  # a new queue enters at earliest
    assert r.partitions(start, start) == []
    (part,) = r.partitions(start, {"g1": {"0": 500}})
    batches = list(r.read(part))
    assert sum(b.num_rows for b in batches) == 490
    assert batches[0].column("queue_offset")[0].as_py() == 10
    assert replicas["leader"].pulls == 0 and replicas["leader"].searches == 0


def test_min_offsets_per_trigger_waits_for_enough_new_offsets_up_to_max_trigger_delay(
        replicas: dict[str, FakeReplica]) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from spark.datasource import RaftMQStreamReader

    servers = ",".join(r.address for r in replicas.values())
    r = RaftMQStreamReader(parse_options({"servers": servers, "topic": TOPIC, "minOffsetsPerTrigger": "600",
                                          "maxTriggerDelay": "30s"}))
    now = [100.0]
    r._clock = lambda: now[0]
    assert r.opts.max_trigger_delay_s == 30.0
    start = {"g1": {"0": 500}}  # 500 new offsets available (the replicas hold 1000)
    assert r.latestOffset(start, ReadAllAvailable()) == start  # fewer than 600: no batch yet
    now[0] += 29.0
    assert r.latestOffset(start, ReadAllAvailable()) == start
    now[0] += 1.0  # maxTriggerDelay since the last batch: what there is goes
    assert r.latestOffset(start, ReadAllAvailable()) == {"g1": {"0": 1000}}
    assert r.latestOffset({"g1": {"0": 300}}, ReadAllAvailable()) == {"g1": {"0": 1000}}  # 700 >= 600
    now[0] += 5.0
    assert r.latestOffset(start, ReadAllAvailable()) == start  # the delay counts from that batch
    r.prepareForTriggerAvailableNow()  # availableNow never waits
    assert r.latestOffset(start, ReadAllAvailable()) == {"g1": {"0": 1000}}
    with pytest.raises(OptionError, match="maxTriggerDelay"):
        parse_options({"servers": servers, "topic": TOPIC, "maxTriggerDelay": "soon"})
    ms = parse_options({"servers": servers, "topic": TOPIC, "maxTriggerDelay": "1500"})
    assert ms.max_trigger_delay_s == 1.5
