"""A streaming query reading topic A and writing topic B through the ``raftmq`` sink,
exactly once: its driver (and JVM and Python workers) SIGKILLed in the middle of a
micro-batch's write, twice, and restarted from its checkpoint; then the group's leader
killed with kill -9 during a write. B must hold every message of A exactly once, each
key's messages in A's order.

The query runs in its own process (``tests/spark/stream_job.py --sink-topic``). A batch is
"in the middle of its write" when it is planned (offsets/N) but not committed and B already
holds more messages than the committed batches read: some of its records are stored, so the
restarted query's replay of that batch must be answered as already stored.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from raftmq.local_group import LocalGroup
from spark.options import parse_options
from spark.planning import current_offsets
from tests.spark.conftest import SPARK_ENV, create_topic, leader_name, send, servers, wait_caught_up
from tests.spark.test_stream_cluster import batch_ids, descendants, kill_pid, source_offsets, wait_gone
from tests.support.procs import ManagedProcess, ProcessGroup

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SOURCE, SINK = "pipe-a", "pipe-b"
MESSAGES = 24_000  # 4 keys, one per queue of A


def stored(group: LocalGroup, topic: str) -> int:
    """Messages committed in ``topic`` (the leader's queue ends)."""
    opts = parse_options({"servers": ",".join(servers(group)), "topic": topic, "readFrom": "leader",
                          "followerWaitMs": "20000"})
    return sum(b.high - b.low for b in current_offsets(opts))


def read_so_far(checkpoint: Path) -> int:
    """Messages of A the committed batches read (0 before the first)."""
    commits = batch_ids(checkpoint, "commits")
    return sum(source_offsets(checkpoint, commits[-1]).values()) if commits else 0


def wait_mid_write(p: ManagedProcess, checkpoint: Path, group: LocalGroup, after: int,
                   timeout: float = 120) -> int:
    """Wait until batch > ``after`` is planned, not committed, and partly stored in B.
    Returns that batch."""
    deadline = time.monotonic() + timeout
    while True:
        assert p.alive, f"the query exited early:\n{p.log_tail()}"
        assert time.monotonic() < deadline, f"no batch caught mid-write in {timeout} s:\n{p.log_tail()}"
        offsets, commits = batch_ids(checkpoint, "offsets"), batch_ids(checkpoint, "commits")
        if offsets and offsets[-1] > after and (not commits or offsets[-1] > commits[-1]):
            done = read_so_far(checkpoint)
            in_b = stored(group, SINK)
            if in_b > done and batch_ids(checkpoint, "commits") == commits:
                return offsets[-1]
        time.sleep(0.005)


def kill_driver(p: ManagedProcess, jvms: list[tuple[int, str]]) -> None:
    jvms.extend(c for c in descendants(p.pid) if c not in jvms)
    p.kill()
    for proc in jvms:
        kill_pid(proc)
    for pid, _ in jvms:
        wait_gone(pid, 10)


def check_b(session: Any, group: LocalGroup, expected: dict[str, list[str]]) -> int:
    rows = (session.read.format("raftmq").option("servers", ",".join(servers(group))).option("topic", SINK)
            .option("readFrom", "any").load()
            .selectExpr("cast(body as string) as body", "properties['k'] as k", "broker_group", "queue_id",
                        "queue_offset").collect())
    bodies = [r.body for r in rows]
    want = {b for bs in expected.values() for b in bs}
    lost, dupes = len(want - set(bodies)), len(bodies) - len(set(bodies))
    assert (lost, dupes, len(bodies)) == (0, 0, len(want)), f"{lost} lost, {dupes} duplicated"
    by_key: dict[str, list[tuple[tuple[str, int, int], str]]] = defaultdict(list)
    for r in rows:
        by_key[r.k].append(((r.broker_group, r.queue_id, r.queue_offset), r.body))
    for k, got in by_key.items():
        assert len({q[:2] for q, _ in got}) == 1, f"key {k} in several queues of B"
        assert [b for _, b in sorted(got)] == expected[k], f"key {k}: not in A's order"
    return len(rows)


def test_a_to_b_is_exactly_once_across_two_driver_kills_and_a_leader_kill(
        spark_session: Any, brokers: LocalGroup, tmp_path: Path) -> None:
    create_topic(brokers, SOURCE, queues=4)
    create_topic(brokers, SINK, queues=4)
    sent = send(brokers, SOURCE, MESSAGES, queues=4, body_bytes=64, prefix="a")
    assert sent.count() == MESSAGES
    per_key = MESSAGES // 4
    expected = {str(k): [f"a-{k}-{i}".ljust(64, ".") for i in range(per_key)] for k in range(4)}
    checkpoint = tmp_path / "checkpoint"
    job = [sys.executable, "-m", "tests.spark.stream_job", "--servers", ",".join(servers(brokers)),
           "--topic", SOURCE, "--checkpoint", str(checkpoint), "--sink-topic", SINK,
           "--request-messages", "25", "--max-per-trigger", "2000"]
    jvms: list[tuple[int, str]] = []
    killed: list[int] = []
    p: ManagedProcess | None = None
    wait_caught_up(brokers)
    with ProcessGroup(tmp_path / "logs") as procs:
        try:
            for run in ("run1", "run2"):  # SIGKILL of the driver mid-write, twice
                p = procs.start(run, [*job, "--trigger", "processing", "--seconds", "300"], env=SPARK_ENV,
                                cwd=ROOT)
                killed.append(wait_mid_write(p, checkpoint, brokers, max(killed, default=-1)))
                kill_driver(p, jvms)
                assert killed[-1] not in batch_ids(checkpoint, "commits")
            # the last run: the leader killed with kill -9 while a batch is being written
            p = procs.start("run3", [*job, "--trigger", "available", "--seconds", "240"], env=SPARK_ENV,
                            cwd=ROOT)
            leader = leader_name(brokers)
            in_write = wait_mid_write(p, checkpoint, brokers, max(killed))
            brokers.kill(leader)
            status = p.wait(240)
            assert status == 0, f"run3 exited {status}:\n{p.log_tail()}"
            assert in_write in batch_ids(checkpoint, "commits")
        finally:  # a run still up (a failed assertion): its JVM and workers too, by PID
            if p is not None and p.alive:
                jvms.extend(c for c in descendants(p.pid) if c not in jvms)
            for proc in jvms:
                kill_pid(proc)
    brokers.start_node(leader)
    wait_caught_up(brokers)
    assert read_so_far(checkpoint) == MESSAGES
    n = check_b(spark_session, brokers, expected)
    print(f"\nB holds {n} of {MESSAGES} exactly once; driver killed mid-write in batches {killed}, "
          f"leader {leader} killed mid-write in batch {in_write}; "
          f"batches {len(batch_ids(checkpoint, 'commits'))}")
