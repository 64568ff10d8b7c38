"""`mqadmin` of rocketmq-tools 4.9.7, unchanged, against RaftMQ (issue 27): clusterList,
topicList, topicRoute, updateTopic, topicStatus, consumerProgress, queryMsgByKey and
queryMsgById print sane answers about a topic the Java client wrote 6 messages to and a
group consumed them. The same tests pass against the real RocketMQ
(``COMPAT_TARGET=reference``, see conftest.py)."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from tests.compat.harness import JavaRun, mqadmin, run_scenario
from tests.compat.targets import Target

pytestmark = [pytest.mark.cluster, pytest.mark.compat]



@dataclass(frozen=True)
class Loaded:
    topic: str
    group: str
    sent: dict[str, dict[str, Any]]  # key -> "sent" event


@pytest.fixture(scope="module")
def loaded(target: Target) -> Loaded:
    """A 4-queue topic with 3 sync sends and a batch of 3 from the Java client, consumed
    to the end by one push consumer group (its offsets committed at shutdown)."""
    target.require_frontend()
    suffix = uuid.uuid4().hex[:8]
    topic, group = f"compat-admin-{suffix}", f"cg-admin-{suffix}"
    target.create_topic(topic, 4)
    produce = run_scenario("produce", target.namesrv, log_dir=target.logs / f"produce-{suffix}",
                           topic=topic, run=suffix, count=3)
    assert produce.rc == 0, produce.tail()
    consume = run_scenario("consume", target.namesrv, log_dir=target.logs / f"consume-{suffix}",
                           topic=topic, group=group, run=suffix + "c", count=6)
    assert consume.rc == 0, consume.tail()
    return Loaded(topic, group, {e["key"]: e for e in produce.of("sent")})


def admin(target: Target, *command: str) -> JavaRun:
    target.require_frontend()
    run = mqadmin(list(command), target.namesrv, log_dir=target.logs / f"mqadmin-{command[0]}")
    assert run.rc == 0, run.tail()
    return run


def rows(run: JavaRun) -> list[list[str]]:
    """The whitespace-split rows of a table mqadmin printed, header (`#...`) excluded."""
    return [line.split() for line in run.stdout.splitlines() if line.strip() and not line.startswith("#")]


def fastjson(text: str) -> Any:
    """mqadmin prints routes with fastjson, whose map keys may be bare numbers."""
    return json.loads(re.sub(r"([{,]\s*)(\d+):", r'\1"\2":', text))


def test_cluster_list_shows_each_broker_name_with_its_replicas(target: Target) -> None:
    run = admin(target, "clusterList")
    brokers = [r for r in rows(run) if r[0] == target.cluster]
    assert {r[1] for r in brokers} == set(target.broker_names)
    assert len(brokers) == target.replicas * len(target.broker_names)
    for name in target.broker_names:
        bids = sorted(int(r[2]) for r in brokers if r[1] == name)
        assert bids[0] == 0 and len(set(bids)) == len(bids), bids  # one master, distinct slave ids
    assert all(re.fullmatch(r"127\.0\.0\.1:\d+", r[3]) for r in brokers)


def test_topic_list_has_the_topic(target: Target, loaded: Loaded) -> None:
    assert loaded.topic in admin(target, "topicList").stdout.split()


def test_topic_route_names_the_brokers_and_queues(target: Target, loaded: Loaded) -> None:
    route = fastjson(admin(target, "topicRoute", "-t", loaded.topic).stdout)
    assert {b["brokerName"] for b in route["brokerDatas"]} == set(target.broker_names)
    for b in route["brokerDatas"]:
        assert "0" in b["brokerAddrs"]  # a master to send to
    assert [(q["readQueueNums"], q["writeQueueNums"]) for q in route["queueDatas"]] == [(4, 4)]


def test_update_topic_creates_a_topic_the_route_shows(target: Target) -> None:
    topic = f"compat-made-{uuid.uuid4().hex[:8]}"
    admin(target, "updateTopic", "-c", target.cluster, "-t", topic, "-r", "3", "-w", "3")
    route = fastjson(admin(target, "topicRoute", "-t", topic).stdout)
    assert [(q["readQueueNums"], q["writeQueueNums"]) for q in route["queueDatas"]] == [(3, 3)]


def test_topic_status_counts_the_messages(target: Target, loaded: Loaded) -> None:
    table = rows(admin(target, "topicStatus", "-t", loaded.topic))
    assert sorted(int(r[1]) for r in table) == [0, 1, 2, 3]
    assert sum(int(r[3]) - int(r[2]) for r in table) == 6  # max - min offsets


def test_consumer_progress_shows_the_group_caught_up(target: Target, loaded: Loaded) -> None:
    run = admin(target, "consumerProgress", "-g", loaded.group)
    table = [r for r in rows(run) if r[0] == loaded.topic]
    assert sorted(int(r[2]) for r in table) == [0, 1, 2, 3]
    assert sum(int(r[3]) for r in table) == 6  # broker offsets
    assert all(int(r[3]) == int(r[4]) for r in table)  # consumer offsets = broker offsets
    assert "Diff Total: 0" in run.stdout


def test_query_msg_by_key_finds_the_message(target: Target, loaded: Loaded) -> None:
    sent = loaded.sent["sync-1"]
    table = rows(admin(target, "queryMsgByKey", "-t", loaded.topic, "-k", "sync-1"))
    assert [sent["msgId"], str(sent["queue"]), str(sent["queueOffset"])] in table


def test_query_msg_by_id_shows_the_message(target: Target, loaded: Loaded) -> None:
    sent = loaded.sent["sync-2"]
    out = admin(target, "queryMsgById", "-i", sent["offsetMsgId"]).stdout
    assert re.search(rf"Topic:\s+{re.escape(loaded.topic)}\b", out), out
    assert re.search(r"Keys:\s+\[?sync-2\b", out), out
    assert re.search(rf"Queue ID:\s+{sent['queue']}\b", out), out
