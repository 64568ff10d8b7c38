"""The ``raftmq`` sink with local[2] Spark into a 3-node broker group: a batch write read
back exactly (count, distinct ids, per-key order), written as idempotent records (a second
write of a task's records under the same producer id stores nothing), the columns."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from typing import Any

import pytest

from raftmq.local_group import LocalGroup
from spark.sink_options import parse_sink_options
from tests.spark.conftest import create_topic, servers, wait_caught_up

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

#: Rows of the big batch write (the issue's 200,000; RAFTMQ_SINK_ROWS to change it).
BIG_ROWS = int(os.environ.get("RAFTMQ_SINK_ROWS", "200000"))


def read_topic(session: Any, group: LocalGroup, topic: str) -> list[Any]:
    return (session.read.format("raftmq").option("servers", ",".join(servers(group)))
            .option("topic", topic).option("readFrom", "any").load()
            .selectExpr("cast(body as string) as body", "keys", "tags", "properties", "broker_group",
                        "queue_id", "queue_offset").collect())


def rows_frame(session: Any, n: int, partitions: int = 2) -> Any:
    """``n`` rows: body "<id>", shard_key "p<partition>-k<id % 16>" (a key lives in one
    partition, so its rows have one write order), a key and a tag each."""
    return (session.range(0, n, 1, partitions)
            .selectExpr("cast(id as string) as body",
                        "concat('p', spark_partition_id(), '-k', cast(id % 16 as string)) as shard_key",
                        "array(concat('id-', cast(id as string))) as keys",
                        "case when id % 2 = 0 then 'even' else 'odd' end as tags"))


def check_exact(rows: list[Any], n: int) -> None:
    ids = [int(r.body) for r in rows]
    assert len(ids) == n, f"{len(ids)} rows read back, {n} written"
    assert len(set(ids)) == n, f"{n - len(set(ids))} duplicates"
    assert set(ids) == set(range(n))
    by_queue: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for r, i in zip(rows, ids, strict=True):
        by_queue[(r.broker_group, r.queue_id)].append((r.queue_offset, i))
    per_key: dict[str, list[int]] = defaultdict(list)
    for got in by_queue.values():
        for _, i in sorted(got):
            per_key[f"k{i % 16}-{i >= n // 2}"].append(i)  # range(n, 2 partitions): halves
    for key, order in per_key.items():
        assert order == sorted(order), f"key {key}: not in write order"


@pytest.mark.slow
def test_batch_write_is_read_back_exactly_in_per_key_order(spark_session: Any, brokers: LocalGroup) -> None:
    create_topic(brokers, "sink-big", queues=8)
    started = time.monotonic()
    (rows_frame(spark_session, BIG_ROWS).write.format("raftmq")
     .option("servers", ",".join(servers(brokers))).option("topic", "sink-big").mode("append").save())
    print(f"\nwrote {BIG_ROWS} rows in {time.monotonic() - started:.1f} s")
    wait_caught_up(brokers)
    rows = read_topic(spark_session, brokers, "sink-big")
    check_exact(rows, BIG_ROWS)
    assert {r.tags for r in rows} == {"even", "odd"}
    assert all(r.keys == [f"id-{r.body}"] for r in rows)


def test_columns_topic_per_row_properties_and_string_body(spark_session: Any, brokers: LocalGroup) -> None:
    create_topic(brokers, "sink-a", queues=2)
    create_topic(brokers, "sink-b", queues=2)
    df = spark_session.createDataFrame(
        [("sink-a", "one", {"x": "1"}), ("sink-b", "two", {"x": "2"}), ("sink-a", "three", None)],
        "topic string, body string, properties map<string,string>")
    df.write.format("raftmq").option("servers", ",".join(servers(brokers))).mode("append").save()
    wait_caught_up(brokers)
    a = sorted((r.body, r.properties) for r in read_topic(spark_session, brokers, "sink-a"))
    b = [(r.body, r.properties) for r in read_topic(spark_session, brokers, "sink-b")]
    assert [body for body, _ in a] == ["one", "three"]
    assert dict(a[0][1]) == {"x": "1"} and b == [("two", {"x": "2"})]


def test_a_dataframe_without_body_is_refused_on_the_driver(spark_session: Any, brokers: LocalGroup) -> None:
    df = spark_session.createDataFrame([("x",)], "value string")
    with pytest.raises(Exception, match="column body"):
        df.write.format("raftmq").option("servers", ",".join(servers(brokers))).option(
            "topic", "sink-a").mode("append").save()


def test_the_same_records_written_again_as_the_same_producer_are_stored_once(brokers: LocalGroup) -> None:
    """What a re-attempted task, a speculative copy or a replayed micro-batch does: the
    partition writer sends the same rows again under the same producer id."""
    import pyarrow as pa

    from spark.sink_writer import write_partition

    create_topic(brokers, "sink-replay", queues=4)
    opts = parse_sink_options({"servers": ",".join(servers(brokers)), "topic": "sink-replay",
                               "requestMessages": "100"})
    n = 2500
    batch = pa.record_batch({"body": [str(i) for i in range(n)],
                             "shard_key": [f"k{i % 7}" for i in range(n)]})
    first = write_partition(opts, "spark/test-query/0/0", [batch])
    assert (first.rows, first.duplicates) == (n, 0)
    again = write_partition(opts, "spark/test-query/0/0", [batch])
    assert (again.rows, again.duplicates) == (n, n), "a replay must be answered as already stored"
    other = write_partition(opts, "spark/test-query/1/0", [batch.slice(0, 10)])
    assert other.duplicates == 0
    wait_caught_up(brokers)


def test_deliver_at_ms_holds_a_row_until_its_time(spark_session: Any, brokers: LocalGroup) -> None:
    """The held row is stored in its queue only when due: its store time is at or after
    deliver_at_ms, 10 s after a write that takes about a second once Spark is warm."""
    create_topic(brokers, "sink-delayed", queues=2)
    spark_session.range(10).count()  # Spark warm (this file may run alone)
    at = int(time.time() * 1000) + 10_000
    df = spark_session.createDataFrame([("now", None), ("later", at)], "body string, deliver_at_ms bigint")
    df.write.format("raftmq").option("servers", ",".join(servers(brokers))).option(
        "topic", "sink-delayed").mode("append").save()
    deadline = time.monotonic() + 60
    while True:
        rows = (spark_session.read.format("raftmq").option("servers", ",".join(servers(brokers)))
                .option("topic", "sink-delayed").option("readFrom", "any").load()
                .selectExpr("cast(body as string) as body", "unix_millis(store_timestamp) as ms").collect())
        if len(rows) == 2:
            break
        assert time.monotonic() < deadline, f"the delayed row never came: {rows}"
        time.sleep(0.5)
    stored = {r.body: r.ms for r in rows}
    assert at <= stored["later"], stored
    print(f"\nstored: the row without a time {(stored['now'] - at) / 1000:+.1f} s from deliver_at_ms, "
          f"the held one {(stored['later'] - at) / 1000:+.1f} s")
