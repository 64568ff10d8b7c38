"""Client pure modules: queues and sharding, rebalance strategies, tag selectors, backoff."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protocol.tags
from client import tag_filter
from client.aio.core import ClientCore
from client.backoff import Deadline, backoff_delays
from client.errors import DiskFullError
from client.queues import MessageQueue, shard_queue
from client.rebalance import STRATEGIES, allocate_averagely, allocate_by_circle
from client.tag_filter import SubscriptionError, TagSelector, parse_tags
from protocol.remoting import ResponseCode

# Eight queues over two groups, given out of order on purpose.
QUEUES = [MessageQueue("t", f"g{i // 4}", i % 4) for i in (5, 2, 7, 0, 3, 6, 1, 4)]
SORTED = sorted(QUEUES)


def mq(i: int) -> MessageQueue:
    return SORTED[i]


# --- queues ------------------------------------------------------------------


def test_message_queue_str_and_order() -> None:
    assert str(MessageQueue("orders", "g1", 3)) == "orders@g1#3"
    assert [str(q) for q in SORTED[:5]] == ["t@g0#0", "t@g0#1", "t@g0#2", "t@g0#3", "t@g1#0"]
    assert MessageQueue("a", "z", 9) < MessageQueue("b", "a", 0)
    assert MessageQueue("t", "g", 1) == MessageQueue("t", "g", 1)
    assert len({MessageQueue("t", "g", 1), MessageQueue("t", "g", 1)}) == 1
    with pytest.raises(AttributeError):
        MessageQueue("t", "g", 1).queue_id = 2  # type: ignore[misc]


def test_shard_queue_is_pinned() -> None:
    # murmur3 32-bit, seed 0, unsigned: "order-42" -> 1259446670, % 8 = 6 -> the 7th sorted queue.
    # A change of hash function, seed, signedness or ordering makes this fail.
    assert shard_queue("order-42", QUEUES) == MessageQueue("t", "g1", 2)
    assert shard_queue("user-7", QUEUES) == MessageQueue("t", "g0", 0)  # 1745014256 % 8 == 0
    assert shard_queue("", QUEUES) == MessageQueue("t", "g0", 0)  # the hash of no bytes is 0
    assert shard_queue("order-42", QUEUES[:3]) == sorted(QUEUES[:3])[1259446670 % 3]


def test_shard_queue_does_not_depend_on_order() -> None:
    shuffled = QUEUES[:]
    random.Random(1).shuffle(shuffled)
    for key in ("a", "b", "order-42", "ключ"):
        assert shard_queue(key, shuffled) == shard_queue(key, QUEUES) == shard_queue(key, SORTED)


def test_shard_queue_needs_a_queue() -> None:
    with pytest.raises(ValueError, match="no queue"):
        shard_queue("k", [])


# --- rebalance ---------------------------------------------------------------


def test_averagely_three_clients_eight_queues() -> None:
    clients = ["c2", "c0", "c1"]
    got = [allocate_averagely(c, clients, QUEUES) for c in ("c0", "c1", "c2")]
    assert [len(part) for part in got] == [3, 3, 2]
    assert got == [SORTED[0:3], SORTED[3:6], SORTED[6:8]]


def test_averagely_exact_cases() -> None:
    four = SORTED[:4]
    # more clients than queues: one each, the last clients get nothing
    assert [allocate_averagely(c, ["a", "b", "c", "d", "e", "f"], four) for c in "abcdef"] == [
        [mq(0)], [mq(1)], [mq(2)], [mq(3)], [], []]
    # even split
    assert [allocate_averagely(c, ["a", "b"], SORTED) for c in "ab"] == [SORTED[:4], SORTED[4:]]
    # 3 clients, 7 queues: 3, 2, 2
    seven = SORTED[:7]
    assert [allocate_averagely(c, ["a", "b", "c"], seven) for c in "abc"] == [
        seven[0:3], seven[3:5], seven[5:7]]
    assert allocate_averagely("a", ["a"], QUEUES) == SORTED


def test_by_circle_exact_cases() -> None:
    clients = ["c1", "c2", "c0"]
    assert allocate_by_circle("c0", clients, QUEUES) == [mq(0), mq(3), mq(6)]
    assert allocate_by_circle("c1", clients, QUEUES) == [mq(1), mq(4), mq(7)]
    assert allocate_by_circle("c2", clients, QUEUES) == [mq(2), mq(5)]
    ten = [f"c{i}" for i in range(10)]
    assert allocate_by_circle("c7", ten, QUEUES) == [mq(7)]
    assert allocate_by_circle("c9", ten, QUEUES) == []


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_strategy_edge_cases(name: str) -> None:
    allocate = STRATEGIES[name]
    assert allocate("stranger", ["a", "b"], QUEUES) == []
    assert allocate("a", [], QUEUES) == []
    assert allocate("a", ["a", "b"], []) == []
    # duplicates are ignored, order of the inputs does not matter
    assert allocate("a", ["b", "a", "a"], QUEUES + QUEUES) == allocate("a", ["a", "b"], SORTED)


def test_strategies_registry() -> None:
    assert dict(STRATEGIES) == {"averagely": allocate_averagely, "circle": allocate_by_circle}


client_ids = st.lists(st.text(alphabet="abcdefgh", min_size=1, max_size=3),
                      min_size=1, max_size=12, unique=True)
queue_lists = st.lists(
    st.builds(MessageQueue, st.sampled_from(["t", "u"]), st.sampled_from(["g0", "g1", "g2"]),
              st.integers(0, 15)),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(clients=client_ids, queues=queue_lists, name=st.sampled_from(sorted(STRATEGIES)),
       seed=st.integers(0, 99))
def test_allocation_partitions_the_queues(
    clients: list[str], queues: list[MessageQueue], name: str, seed: int
) -> None:
    allocate = STRATEGIES[name]
    shuffled = clients[:]
    random.Random(seed).shuffle(shuffled)  # each member may see the ids in another order
    parts = [allocate(me, shuffled if i % 2 else clients, queues) for i, me in enumerate(clients)]
    seen: list[MessageQueue] = [q for part in parts for q in part]
    assert len(seen) == len(set(seen)), "a queue was given to two members"
    assert set(seen) == set(queues)


@settings(max_examples=150, deadline=None)
@given(clients=client_ids, queues=queue_lists)
def test_averagely_gives_contiguous_near_equal_slices(clients: list[str], queues: list[MessageQueue]) -> None:
    ordered = sorted(set(queues))
    parts = [allocate_averagely(me, clients, queues) for me in sorted(clients)]
    sizes = [len(part) for part in parts]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True), "the larger slices go to the first members"
    start = 0
    for part in parts:
        assert part == ordered[start:start + len(part)]
        start += len(part)
    assert start == len(ordered)


# --- tag filter --------------------------------------------------------------


@pytest.mark.parametrize("expression", [None, "", "*", "  ", " * "])
def test_parse_all(expression: str | None) -> None:
    selector = parse_tags(expression)
    assert selector.tags is None
    assert selector.hashes() is None
    assert selector.matches("a") and selector.matches(None) and selector.matches("")
    assert selector.expression == ("*" if expression is None else expression)


@pytest.mark.parametrize(("expression", "tags"), [
    ("a", {"a"}),
    ("a || b", {"a", "b"}),
    ("a||b", {"a", "b"}),
    ("  TagA ||   TagB  || TagA ", {"TagA", "TagB"}),
    ("a || || b ||", {"a", "b"}),
    ("|| a", {"a"}),
    ("a | b", {"a | b"}),  # a single bar is part of a tag
    ("|||", {"|"}),
    ("tag with space", {"tag with space"}),
])
def test_parse_tags(expression: str, tags: set[str]) -> None:
    selector = parse_tags(expression)
    assert selector == TagSelector(expression, frozenset(tags))


@pytest.mark.parametrize(("expression", "why"), [
    ("||", "names no tag"),
    (" || ||  ", "names no tag"),
    ("|| ||", "names no tag"),
    ("a || *", "combines"),
    ("* || *", "combines"),
])
def test_parse_errors(expression: str, why: str) -> None:
    with pytest.raises(SubscriptionError, match=why) as raised:
        parse_tags(expression)
    assert isinstance(raised.value, ValueError)


def test_tag_hashes_are_the_protocols() -> None:
    assert tag_filter.tag_hash is protocol.tags.tag_hash
    tag_hash = protocol.tags.tag_hash
    selector = parse_tags("b || a")
    assert selector.hashes() == sorted([tag_hash("a"), tag_hash("b")])
    # pinned: 64-bit signed murmur3, as stored in ConsumeQueue units
    assert sorted(selector.hashes() or []) == [-8839064797231613815, 8833996863197925870]
    assert 0 not in (selector.hashes() or [])


def test_matches_is_exact() -> None:
    selector = parse_tags("a || b")
    assert selector.matches("a") and selector.matches("b")
    assert not selector.matches("c")
    assert not selector.matches("A")
    assert not selector.matches(" a")
    assert not selector.matches(None), "a message with no tag matches only '*'"
    assert not selector.matches("")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(alphabet="ab |*x ", max_size=6), min_size=1, max_size=5))
def test_parse_round_trip(parts: list[str]) -> None:
    expression = "||".join(parts)
    try:
        selector = parse_tags(expression)
    except SubscriptionError:
        assert expression.strip() not in ("", "*")
        return
    if selector.tags is None:
        assert expression.strip() in ("", "*")
        return
    assert selector.tags
    for tag in selector.tags:
        assert tag == tag.strip() and tag and "||" not in tag and tag != "*"
        assert selector.matches(tag)
    assert parse_tags(" || ".join(sorted(selector.tags))).tags == selector.tags


# --- backoff -----------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_deadline_with_fake_clock() -> None:
    clock = FakeClock()
    deadline = Deadline(2.0, clock=clock)
    assert deadline.remaining() == 2.0 and not deadline.expired()
    clock.now += 1.5
    assert deadline.remaining() == pytest.approx(0.5) and not deadline.expired()
    clock.now += 0.5
    assert deadline.remaining() == 0.0 and deadline.expired()
    clock.now += 10
    assert deadline.remaining() == 0.0 and deadline.expired()


def test_deadline_real_clock() -> None:
    assert Deadline(0).expired()
    assert Deadline(-1).remaining() == 0.0
    deadline = Deadline(60)
    assert not deadline.expired() and 59 < deadline.remaining() <= 60
    with pytest.raises(ValueError):
        Deadline(float("nan"))


def take(delays: Iterator[float], n: int) -> list[float]:
    return list(itertools.islice(delays, n))


def test_backoff_without_jitter() -> None:
    assert take(backoff_delays(jitter=0), 8) == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
    assert take(backoff_delays(first=1, factor=3, cap=20, jitter=0), 5) == [1, 3, 9, 20, 20]
    assert take(backoff_delays(first=0.5, factor=1, jitter=0), 3) == [0.5, 0.5, 0.5]
    assert take(backoff_delays(first=5, cap=1, jitter=0), 2) == [1, 1]


def test_backoff_jitter_is_bounded_and_seeded() -> None:
    delays = take(backoff_delays(rng=random.Random(7)), 50)
    assert delays == take(backoff_delays(rng=random.Random(7)), 50)
    base = [min(0.05 * 2**n, 1.0) for n in range(50)]
    for delay, b in zip(delays, base, strict=True):
        assert 0.8 * b - 1e-12 <= delay <= min(1.0, 1.2 * b) + 1e-12
    assert len(set(delays[10:])) > 30, "delays at the cap still spread"
    assert max(delays) <= 1.0
    assert min(delays[10:]) < 0.9


@settings(max_examples=100, deadline=None)
@given(first=st.floats(0.001, 10), factor=st.floats(1, 10), cap=st.floats(0.001, 100),
       jitter=st.floats(0, 1), seed=st.integers(0, 2**32))
def test_backoff_delays_stay_in_band(
    first: float, factor: float, cap: float, jitter: float, seed: int
) -> None:
    base = min(first, cap)
    for delay in take(backoff_delays(first, factor, cap, jitter, random.Random(seed)), 60):
        assert 0 <= delay <= cap
        assert base * (1 - jitter) * (1 - 1e-9) <= delay <= base * (1 + jitter) * (1 + 1e-9)
        base = min(cap, base * factor)


@pytest.mark.parametrize("kwargs", [
    {"first": 0}, {"first": -1}, {"factor": 0.5}, {"cap": 0}, {"jitter": -0.1}, {"jitter": 1.5},
    {"first": float("nan")},
])
def test_backoff_rejects_bad_arguments(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        backoff_delays(**kwargs)  # type: ignore[arg-type]


# --- a write the leader answers DISK_FULL ---------------------------------------------
def test_disk_full_is_asked_of_the_leader_again_and_is_what_the_caller_gets() -> None:
    """The leader answered: asking its followers would only earn NOT_LEADER redirects, and
    the caller would be told NOT_LEADER instead of why the write was not stored."""
    asked: list[str] = []

    async def request(address: str, request: object, timeout: float) -> object:
        asked.append(address)
        raise DiskFullError(ResponseCode.DISK_FULL, "replicas n2, n3 of group g1 cannot store entries",
                            address)

    async def run() -> None:
        core = ClientCore(servers=["leader:1"])
        core.routes.leader_candidates = lambda group: ["leader:1", "follower:2"]  # type: ignore[method-assign]
        core.pool.request = request  # type: ignore[method-assign]
        with pytest.raises(DiskFullError, match="n2, n3"):
            await core.leader_request("g1", object(), deadline=Deadline(0.4))  # type: ignore[arg-type]

    asyncio.run(run())
    assert len(asked) >= 2 and set(asked) == {"leader:1"}
