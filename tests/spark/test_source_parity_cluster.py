"""Source options of spark-sql-kafka parity against a 3-node group with local[2] Spark: an
SQL92 ``filter`` evaluated by the brokers, and ``groupId`` (a streaming query's progress
committed to a consumer group, so ``raftmq group progress`` shows its lag -- one
micro-batch behind: Spark commits a batch's end to the source when it plans the next)."""

from __future__ import annotations

import asyncio
import json
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
