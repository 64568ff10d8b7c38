"""Batch reads with local[2] Spark from a 3-node broker group: what was sent comes back
exactly, from the followers only, and a follower killed mid-read does not fail the job."""

from __future__ import annotations

import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from raftmq.local_group import LocalGroup
from spark.examples.tag_volume import DEMO_TAGS
from tests.spark.conftest import (
    SPARK_ENV,
    Sent,
    create_topic,
    leader_name,
    pulled,
    send,
    servers,
    wait_caught_up,
)
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]


def reader(session: Any, group: LocalGroup, topic: str, **options: str) -> Any:
    r = session.read.format("raftmq").option("servers", ",".join(servers(group))).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def check_equal(rows: list[Any], sent: Sent) -> None:
    """Count, distinct ids and the order within each queue are what was acknowledged."""
    assert len(rows) == sent.count()
    assert len({r.msg_id for r in rows}) == len(rows), "a message came twice"
    assert {r.msg_id for r in rows} == sent.ids
    by_queue: dict[tuple[str, int], list[tuple[int, str]]] = defaultdict(list)
    for r in rows:
        by_queue[(r.broker_group, r.queue_id)].append((r.queue_offset, r.msg_id))
    assert set(by_queue) == set(sent.by_queue)
    for key, got in by_queue.items():
        got.sort()
        assert [o for o, _ in got] == list(range(len(got))), f"queue {key}: offsets not contiguous from 0"
        assert [i for _, i in got] == sent.by_queue[key], f"queue {key}: not in send order"


@pytest.mark.slow
def test_batch_read_of_50k_equals_what_was_sent_and_the_leader_serves_none(
        spark_session: Any, brokers: LocalGroup) -> None:
    create_topic(brokers, "big", queues=8)
    sent = send(brokers, "big", 50_000, queues=8, body_bytes=256)
    assert sent.count() == 50_000
    wait_caught_up(brokers)
    leader = leader_name(brokers)
    before = pulled(brokers)
    df = reader(spark_session, brokers, "big").selectExpr(
        "broker_group", "queue_id", "queue_offset", "msg_id", "tags", "length(body) AS size", "keys",
        "properties", "topic")
    started = time.monotonic()
    rows = df.collect()
    took = time.monotonic() - started
    after = pulled(brokers)
    check_equal(rows, sent)
    assert all(r.size == 256 and r.topic == "big" and len(r.keys) == 1 for r in rows)
    assert all(sent.tags[r.msg_id] == r.tags for r in rows)
    assert rows[0].properties.keys() == {"k"}
    delta = {n: after[n] - before[n] for n in after}
    assert delta[leader] == 0, f"the leader served {delta[leader]} messages: {delta}"
    followers = [n for n in delta if n != leader]
    assert sum(delta[n] for n in followers) >= 50_000
    assert all(delta[n] > 0 for n in followers), f"one follower did all the work: {delta}"
    print(f"50,000 rows collected in {took:.1f} s; pulled per node: {delta}")


def test_offsets_timestamps_tags_and_read_from(spark_session: Any, brokers: LocalGroup) -> None:
    create_topic(brokers, "opts", queues=4)
    first = send(brokers, "opts", 800, queues=4, prefix="w1")
    time.sleep(0.05)
    middle_ms = int(time.time() * 1000)
    time.sleep(0.05)
    second = send(brokers, "opts", 800, queues=4, prefix="w2")
    wait_caught_up(brokers)
    everything = Sent({k: first.by_queue[k] + second.by_queue[k] for k in first.by_queue},
                      {**first.tags, **second.tags})

    def ids(**options: str) -> list[Any]:
        return reader(spark_session, brokers, "opts", **options).select(
            "broker_group", "queue_id", "queue_offset", "msg_id", "tags").collect()

    check_equal(ids(), everything)
    assert {r.msg_id for r in ids(startingOffsets=str(middle_ms))} == second.ids
    assert {r.msg_id for r in ids(endingOffsets=str(middle_ms))} == first.ids
    assert ids(startingOffsets="latest") == []
    window = ids(startingOffsets='{"g1": {"0": 5}}', endingOffsets='{"g1": {"0": 10, "1": 0}}')
    assert sorted(r.queue_offset for r in window if r.queue_id == 0) == list(range(5, 10))
    assert not [r for r in window if r.queue_id == 1]
    assert len([r for r in window if r.queue_id == 2]) == 400
    tagged = ids(tags="red || gold")
    assert {r.msg_id for r in tagged} == {i for i, t in everything.tags.items() if t in ("red", "gold")}
    leader = leader_name(brokers)
    before = pulled(brokers)
    assert len(ids(readFrom="leader")) == 1600
    after = pulled(brokers)
    # pages are whole records: a record across two pipelined requests' offsets ships twice
    assert after[leader] - before[leader] >= 1600
    assert all(after[n] == before[n] for n in after if n != leader)
    with pytest.raises(Exception, match=r"no longer retained|startingOffsets"):
        ids(startingOffsets='{"g1": {"0": 5000}}', endingOffsets='{"g1": {"0": 10}}')


@pytest.mark.slow
def test_a_follower_killed_mid_read_does_not_fail_the_job(spark_session: Any, brokers: LocalGroup) -> None:
    create_topic(brokers, "kill", queues=4)
    sent = send(brokers, "kill", 20_000, queues=4, body_bytes=256)
    wait_caught_up(brokers)
    leader = leader_name(brokers)
    followers = [n for n in brokers.nodes if n != leader]
    before = pulled(brokers)
    # small pages, one in flight: the read takes long enough to kill a follower in the middle
    df = reader(spark_session, brokers, "kill", pullBatch="4", pipeline="1").select(
        "broker_group", "queue_id", "queue_offset", "msg_id")
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["rows"] = df.collect()
        except Exception as e:  # reported by the main thread
            result["error"] = e

    job = threading.Thread(target=run)
    job.start()
    killed = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and job.is_alive():
            now = pulled(brokers)
            done = {n: now[n] - before[n] for n in followers}
            if sum(done.values()) >= 3_000:
                killed = max(followers, key=lambda n: done[n])
                brokers.kill(killed)
                break
            time.sleep(0.05)
        assert killed is not None and job.is_alive(), "the read ended before a follower could be killed"
        killed_at = sum(done.values())
        job.join(timeout=180)
        assert not job.is_alive(), "the read did not finish within 180 s of the kill"
    finally:
        job.join(timeout=60)
        if killed is not None:
            brokers.start_node(killed)
    assert "error" not in result, result.get("error")
    check_equal(result["rows"], sent)
    survivor = next(n for n in followers if n != killed)
    after = pulled(brokers)
    assert after[leader] - before[leader] == 0
    assert after[survivor] - before[survivor] >= 10_000  # it took over the killed one's ranges
    print(f"killed {killed} after {killed_at} rows were pulled; the job completed from {survivor}")
    wait_caught_up(brokers)


@pytest.mark.slow
def test_the_example_job_runs_with_one_command(spark_session: Any, brokers: LocalGroup,
                                                tmp_path: Path) -> None:
    out = tmp_path / "tag_volume"
    with ProcessGroup(tmp_path / "logs") as procs:
        p = procs.start("tag_volume", [sys.executable, "-m", "spark.examples.tag_volume", "--topic", "demo",
                                       "--send", "5000", "--servers", ",".join(servers(brokers)),
                                       "--out", str(out)], env=SPARK_ENV, cwd=ROOT)
        assert p.wait(240) == 0, p.log_tail()
    tags = {r.tag: r.messages for r in spark_session.read.parquet(str(out / "tag_counts")).collect()}
    assert set(tags) == set(DEMO_TAGS) and sum(tags.values()) == 5000
    minutes = spark_session.read.parquet(str(out / "per_minute")).collect()
    assert sum(r.messages for r in minutes) == 5000 and all(r.bytes > 0 for r in minutes)
