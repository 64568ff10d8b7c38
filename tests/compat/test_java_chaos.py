"""The chaos workload through the stock RocketMQ Java client (issue 27): 8 keys sent in
order through a MessageQueueSelector while the group's leader is killed with SIGKILL; an
orderly push consumer. Nothing acknowledged is lost, each key's first deliveries keep send
order; duplicates (a resend after an unknown outcome: RocketMQ clients have no idempotent
producer) are counted and reported, not failed. Against the reference (one broker) the
workload runs without the kill: it checks the harness, not failover."""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict

import pytest

from tests.compat.harness import start_scenario
from tests.compat.targets import Target
from tests.support.procs import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.compat, pytest.mark.slow]

KEYS, PER_KEY = 8, 150


def test_ordered_sends_through_a_leader_kill_lose_nothing_acknowledged(
    target: Target, record_property: pytest.RecordProperty
) -> None:
    target.require_frontend()
    suffix = uuid.uuid4().hex[:8]
    topic = f"compat-chaos-{suffix}"
    target.create_topic(topic, 8)
    load = start_scenario("ordered-load", target.namesrv, log_dir=target.logs / f"chaos-{suffix}",
                          timeout_s=150, topic=topic, group=f"cg-chaos-{suffix}", run=suffix, keys=KEYS,
                          count=PER_KEY)
    try:
        wait_until(lambda: len(load.events("sent")) >= KEYS * PER_KEY // 3 or load.proc.poll() is not None,
                   90, what="a third of the messages acknowledged")
        if target.group is not None:
            leader = target.group.wait_leader(timeout=30)
            target.group.kill(leader)
            target.group.wait_leader(timeout=30, among=[n for n in target.group.nodes if n != leader])
            target.group.start_node(leader)
        run = load.wait(170)
    finally:
        load.kill()
    assert run.rc == 0, run.tail()
    acked = {(e["key"], int(e["seq"])) for e in run.of("sent")}
    assert len(acked) == KEYS * PER_KEY
    deliveries = [(e["key"], int(e["seq"])) for e in run.of("received")]
    assert acked <= set(deliveries), f"acknowledged, never delivered: {sorted(acked - set(deliveries))[:10]}"
    firsts: dict[str, list[int]] = defaultdict(list)
    for key, seq in dict.fromkeys(deliveries):  # first delivery of each (key, seq), in order
        firsts[key].append(seq)
    for key, seqs in firsts.items():
        assert seqs == sorted(seqs), f"{key} first deliveries out of send order: {seqs}"
    duplicates = sum(n - 1 for n in Counter(deliveries).values())
    failed_sends = len(run.of("send-failed"))
    record_property("duplicates", duplicates)
    record_property("failed_sends", failed_sends)
    print(f"ordered load: {len(acked)} acknowledged, {len(deliveries)} deliveries, {duplicates} duplicates, "
          f"{failed_sends} sends with an unknown outcome (resent)")
