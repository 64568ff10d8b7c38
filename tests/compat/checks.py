"""What tests/compat asserts on a scenario's JSON events, for the Java and the Go harness
alike (their events have the same names and fields), and how a scenario is run on a fresh
topic of a target."""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import Any

from tests.compat.harness import JavaRun, run_scenario
from tests.compat.targets import Target


def scenario(target: Target, name: str, *, client: str = "java", queues: int = 4, timeout_s: float = 60,
             **opts: object) -> JavaRun:
    """Creates a fresh topic, runs scenario `name` of `client` on it and checks it ended well."""
    target.require_frontend()
    suffix = uuid.uuid4().hex[:8]
    topic = f"compat-{client}-{name}-{suffix}"
    target.create_topic(topic, queues)
    run = run_scenario(name, target.namesrv, log_dir=target.logs / f"{client}-{name}-{suffix}",
                       timeout_s=timeout_s, client=client, topic=topic, group=f"cg-{name}-{suffix}",
                       run=suffix, **opts)
    assert run.rc == 0, run.tail()
    return run


def first_deliveries(run: JavaRun, consumer: str | None = None) -> dict[str, dict[str, Any]]:
    """key -> the first "received" event of that key (of one consumer if given)."""
    out: dict[str, dict[str, Any]] = {}
    for e in run.of("received"):
        if consumer is None or e["consumer"] == consumer:
            out.setdefault(e["key"], e)
    return out


def check_sends(run: JavaRun, count: int) -> None:
    """sync, async, oneway and batch sends of `count` each: all received; what the broker
    answered (message id, queue, queue offset) is what the consumer sees."""
    sent = {e["key"]: e for e in run.of("sent")}
    assert len(sent) == 4 * count
    assert {e["status"] for e in sent.values()} <= {"SEND_OK", "ONEWAY"}
    got = first_deliveries(run)
    assert set(sent) <= set(got), sorted(set(sent) - set(got))
    for key, s in sent.items():
        if s["mode"] in ("sync", "async", "batch"):
            assert got[key]["msgId"] == s["msgId"], (key, got[key], s)
            assert (got[key]["queue"], got[key]["queueOffset"]) == (s["queue"], s["queueOffset"]), key
    assert len({s["msgId"] for s in sent.values() if s.get("msgId")}) == 3 * count


def check_ordered(run: JavaRun, keys: int, per_key: int) -> None:
    """Each key went to one queue and its messages were first delivered in send order."""
    sent_queue: dict[str, set[int]] = defaultdict(set)
    for e in run.of("sent"):
        assert e["status"] == "SEND_OK"
        sent_queue[e["key"]].add(e["queue"])
    assert all(len(q) == 1 for q in sent_queue.values()), sent_queue
    seqs: dict[str, list[int]] = defaultdict(list)
    for e in run.of("received"):
        seqs[e["key"]].append(int(e["seq"]))
        assert {e["queue"]} == sent_queue[e["key"]]
    assert len(seqs) == keys
    for key, got in seqs.items():
        firsts = list(dict.fromkeys(got))  # first delivery of each seq, in delivery order
        assert firsts == list(range(per_key)), f"{key}: {got}"


def check_tags(run: JavaRun, count: int) -> None:
    got = first_deliveries(run)
    assert set(got) == {f"taga-{i}" for i in range(count)} | {f"tagb-{i}" for i in range(count)}
    assert {e["tags"] for e in got.values()} == {"TagA", "TagB"}


def check_sql(run: JavaRun, count: int) -> None:
    assert set(first_deliveries(run)) == {f"sqlyes-{i}" for i in range(count)}


def check_broadcast(run: JavaRun, count: int) -> None:
    keys = {f"bc-{i}" for i in range(count)}
    assert set(first_deliveries(run, "b1")) == keys
    assert set(first_deliveries(run, "b2")) == keys


def check_delay(run: JavaRun, low_s: float = 9.0, high_s: float = 11.0) -> list[float]:
    """Every message delivered between low_s and high_s after its send returned; the delays."""
    sent = {e["key"]: e for e in run.of("sent")}
    got = first_deliveries(run)
    assert set(got) == set(sent)
    delays = []
    for key, s in sent.items():
        delay_s = (got[key]["atMs"] - s["atMs"]) / 1000
        assert low_s <= delay_s <= high_s, f"{key} delivered {delay_s:.2f} s after its send returned"
        delays.append(delay_s)
    return delays


def check_retries(run: JavaRun, count: int, max_times: int) -> None:
    """Each key delivered with reconsumeTimes 0..max_times."""
    times: dict[str, set[int]] = defaultdict(set)
    for e in run.of("received"):
        times[e["key"]].add(e["reconsumeTimes"])
    assert dict(times) == {f"retry-{i}": set(range(max_times + 1)) for i in range(count)}


def check_transactions(run: JavaRun, count: int) -> None:
    """Local states as the listener said; every UNKNOW one checked (and committed by the
    check); committed ones delivered, rolled-back halves never."""
    states = {e["key"]: e["localState"] for e in run.of("sent")}
    assert states == {**{f"tx-commit-{i}": "COMMIT_MESSAGE" for i in range(count)},
                      **{f"tx-rollback-{i}": "ROLLBACK_MESSAGE" for i in range(count)},
                      **{f"tx-unknown-{i}": "UNKNOW" for i in range(count)}}
    assert {e["key"] for e in run.of("check")} == {f"tx-unknown-{i}" for i in range(count)}
    assert set(first_deliveries(run)) == {f"tx-{k}-{i}" for k in ("commit", "unknown") for i in range(count)}
