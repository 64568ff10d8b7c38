"""Source options of spark-sql-kafka parity against a 3-node group with local[2] Spark: an
SQL92 ``filter`` evaluated by the brokers, ``groupId`` (a streaming query's progress
committed to a consumer group, so ``raftmq group progress`` shows its lag -- one
micro-batch behind: Spark commits a batch's end to the source when it plans the next),
``startingOffsetsByTimestamp``, and several topics (``topics``, ``topicPattern``)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from client.aio.admin import AsyncAdmin
from raftmq.local_group import LocalGroup
from tests.spark.conftest import create_topic, send, servers, wait_caught_up
from tests.spark.test_stream_cluster import batch_ids, source_offsets

pytestmark = [pytest.mark.spark, pytest.mark.cluster]


def test_filter_is_evaluated_by_the_brokers_and_reads_exactly_the_matches(
        spark_session: Any, brokers: LocalGroup) -> None:
    create_topic(brokers, "parity-filter", queues=4)
    sent = send(brokers, "parity-filter", 4_000, queues=4, prefix="f")  # property k = 0..3, one per queue
    wait_caught_up(brokers)
    rows = (spark_session.read.format("raftmq").option("servers", ",".join(servers(brokers)))
            .option("topic", "parity-filter").option("filter", "k = '2' OR k = '3'").load()
            .select("msg_id", "properties", "broker_group", "queue_id", "queue_offset").collect())
    assert {r.properties["k"] for r in rows} == {"2", "3"}
    assert len(rows) == 2_000 and len({r.msg_id for r in rows}) == 2_000
    matched = {i for key, ids in sent.by_queue.items() for i in ids
               if any(r.msg_id == ids[0] for r in rows)}
    assert {r.msg_id for r in rows} == matched  # every message of the two matching keys' queues
    bad = spark_session.read.format("raftmq").option("servers", ",".join(servers(brokers))) \
        .option("topic", "parity-filter").option("filter", "k = ")
    with pytest.raises(Exception, match="option filter"):
        bad.load().collect()


def test_group_id_commits_the_query_progress_to_a_consumer_group(
        spark_session: Any, brokers: LocalGroup, tmp_path: Path) -> None:
    create_topic(brokers, "parity-group", queues=4)
    send(brokers, "parity-group", 2_000, queues=4, prefix="g")
    wait_caught_up(brokers)
    query = (spark_session.readStream.format("raftmq").option("servers", ",".join(servers(brokers)))
             .option("topic", "parity-group").option("startingOffsets", "earliest")
             .option("groupId", "spark-parity").option("maxRecordsPerTrigger", "800").load()
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120), "the availableNow query did not end within 120 s"
    assert query.exception() is None

    async def progress() -> list[Any]:
        async with AsyncAdmin(servers=servers(brokers)) as admin:
            return await admin.progress("spark-parity", "parity-group")

    rows = asyncio.run(progress())
    assert len(rows) == 4
    # Spark calls the source's commit(end) of batch N when it plans batch N + 1: the group holds
    # the end of the batch before the last one (batches of 800 over 4 queues: 200, 400, 500)
    batches = batch_ids(tmp_path / "ck", "commits")
    assert len(batches) == 3, batches
    before_last = source_offsets(tmp_path / "ck", batches[-2])
    assert {(r.queue.group, r.queue.queue_id): r.committed for r in rows} == before_last
    assert all(r.committed == 400 and r.max_offset == 500 and r.lag == 100 for r in rows), rows
    # the query progress carries latestOffset (reportLatestOffset): what the replicas held
    latest = [p.sources[0].latestOffset for p in query.recentProgress if p.sources]
    held = json.loads(latest[-1]) if latest and latest[-1] is not None else None
    assert isinstance(held, dict), f"no latestOffset in the query progress: {latest}"
    assert sorted(int(o) for queues in held.values() for o in queues.values()) == [500] * 4, held


def test_starting_offsets_by_timestamp_per_queue(spark_session: Any, brokers: LocalGroup) -> None:
    create_topic(brokers, "parity-time", queues=4)
    send(brokers, "parity-time", 800, queues=4, prefix="t1")
    send(brokers, "parity-time", 800, queues=4, prefix="t2")
    wait_caught_up(brokers)
    where = ",".join(servers(brokers))
    every = (spark_session.read.format("raftmq").option("servers", where).option("topic", "parity-time")
             .load().selectExpr("queue_id", "queue_offset", "cast(body as string) as body",
                                "unix_millis(store_timestamp) as ms").collect())
    # per queue 0 and 1: the store time of the second wave's first message; 2 and 3 left out
    starts = {q: min(r.ms for r in every if r.queue_id == q and r.body.startswith("t2-")) for q in (0, 1)}
    spec = json.dumps({"g1": {str(q): ms for q, ms in starts.items()}})
    got = (spark_session.read.format("raftmq").option("servers", where).option("topic", "parity-time")
           .option("startingOffsets", "latest")  # startingOffsetsByTimestamp wins
           .option("startingOffsetsByTimestamp", spec).load().select("queue_id", "queue_offset").collect())
    want = set()
    for q in range(4):
        rows = sorted((r.queue_offset, r.ms) for r in every if r.queue_id == q)
        first = next(o for o, ms in rows if ms >= starts[q]) if q in starts else 0
        want |= {(q, o) for o, _ in rows if o >= first}
    assert {(r.queue_id, r.queue_offset) for r in got} == want
    assert len(got) == len(want) and len(want) < len(every)
    with pytest.raises(Exception, match="startingOffsetsByTimestamp"):
        spark_session.read.format("raftmq").option("servers", where).option("topic", "parity-time") \
            .option("startingOffsetsByTimestamp", '{"g1": {"0": -5}}').load().collect()


def test_topics_reads_every_row_of_each_listed_topic_once(spark_session: Any, brokers: LocalGroup) -> None:
    create_topic(brokers, "multi-a", queues=4)
    create_topic(brokers, "multi-b", queues=2)
    create_topic(brokers, "multi-c", queues=2)  # not listed: never read
    sent = {"multi-a": send(brokers, "multi-a", 2_000, queues=4, prefix="ma"),
            "multi-b": send(brokers, "multi-b", 600, queues=2, prefix="mb")}
    send(brokers, "multi-c", 200, queues=2, prefix="mc")
    wait_caught_up(brokers)
    where = ",".join(servers(brokers))

    def read(**options: str) -> list[Any]:
        df = spark_session.read.format("raftmq").option("servers", where)
        for k, v in options.items():
            df = df.option(k, v)
        return df.load().select("topic", "msg_id", "broker_group", "queue_id", "queue_offset").collect()

    rows = read(topics="multi-a,multi-b")
    assert len(rows) == 2_600 and len({r.msg_id for r in rows}) == 2_600
    for topic, what in sent.items():
        got = {r.msg_id for r in rows if r.topic == topic}
        assert got == what.ids, topic  # each topic's rows carry it, every one of them once
    assert {r.topic for r in rows} == {"multi-a", "multi-b"}
    # startingOffsets per queue of several topics: keyed by topic first
    (b0,) = [k for k in sent["multi-b"].by_queue if k[1] == 0]
    later = read(topics="multi-a,multi-b", startingOffsets=json.dumps({"multi-b": {b0[0]: {"0": 100}}}))
    assert sum(r.topic == "multi-a" for r in later) == 2_000
    assert {(r.queue_id, r.queue_offset) for r in later if r.topic == "multi-b"} == \
        {(r.queue_id, r.queue_offset) for r in rows if r.topic == "multi-b"} - {(0, o) for o in range(100)}
    assert len(later) == 2_500


def test_topic_pattern_stream_takes_a_topic_created_while_it_runs_from_its_earliest_offset(
        spark_session: Any, brokers: LocalGroup, tmp_path: Path) -> None:
    create_topic(brokers, "pat-a", queues=2)
    create_topic(brokers, "other-pat-x", queues=2)  # "pat-.*" matches in full: not this one
    send(brokers, "pat-a", 400, queues=2, prefix="pa0")  # before the query: startingOffsets latest skips it
    wait_caught_up(brokers)
    ck = tmp_path / "ck"
    query = (spark_session.readStream.format("raftmq").option("servers", ",".join(servers(brokers)))
             .option("topicPattern", "pat-.*").option("startingOffsets", "latest")
             .option("groupId", "spark-pattern").load()
             .writeStream.format("memory").queryName("pattern_rows").option("checkpointLocation", str(ck))
             .trigger(processingTime="500 milliseconds").start())
    try:
        def rows_when(count: int) -> list[Any]:
            """The sink's rows once it holds ``count`` (within 90 s); then no more."""
            deadline = time.monotonic() + 90
            while True:
                assert query.exception() is None, query.exception()
                rows = spark_session.sql("select topic, msg_id from pattern_rows").collect()
                if len(rows) >= count or time.monotonic() > deadline:
                    return rows
                time.sleep(0.2)

        wait_for_batches(ck, 1)  # the query started (its first offsets logged) before what follows
        new_a = send(brokers, "pat-a", 100, queues=2, prefix="pa1")
        assert {r.msg_id for r in rows_when(100)} == new_a.ids
        create_topic(brokers, "pat-b", queues=2)  # created while the query runs
        sent_b = send(brokers, "pat-b", 300, queues=2, prefix="pb")
        send(brokers, "other-pat-x", 50, queues=2, prefix="ox")
        rows = rows_when(400)
        assert len(rows) == 400 and {r.msg_id for r in rows} == new_a.ids | sent_b.ids
        assert {r.topic for r in rows if r.msg_id in sent_b.ids} == {"pat-b"}
    finally:
        query.stop()
    assert spark_session.sql("select count(*) from pattern_rows").collect()[0][0] == 400  # none twice
    batches = batch_ids(ck, "commits")
    last = json.loads((ck / "offsets" / str(batches[-1])).read_text().strip().splitlines()[-1])
    assert set(last) == {"pat-a", "pat-b"}  # the checkpoint is keyed by topic first
    assert sum(last["pat-b"]["g1"].values()) == 300 and sum(last["pat-a"]["g1"].values()) == 500
    # groupId: each topic's offsets committed under that topic (Spark commits a batch's end when
    # it plans the next one: the group holds the batch before the last)
    before_last = json.loads((ck / "offsets" / str(batches[-2])).read_text().strip().splitlines()[-1])

    async def progress(topic: str) -> dict[tuple[str, int], int | None]:
        async with AsyncAdmin(servers=servers(brokers)) as admin:
            found = await admin.progress("spark-pattern", topic)
        return {(r.queue.group, r.queue.queue_id): r.committed for r in found}

    for topic, groups in before_last.items():
        want = {(g, int(q)): o for g, queues in groups.items() for q, o in queues.items()}
        assert asyncio.run(progress(topic)) == want, topic


def wait_for_batches(checkpoint: Path, n: int, timeout: float = 60) -> None:
    """Until the query logged the offsets of ``n`` batches (within ``timeout``)."""
    deadline = time.monotonic() + timeout
    while len(batch_ids(checkpoint, "offsets")) < n:
        assert time.monotonic() < deadline, f"no {n} batches' offsets in {checkpoint} after {timeout} s"
        time.sleep(0.1)
