"""The stock Apache RocketMQ 4.9.7 Java client, unchanged, against RaftMQ (issue 27).

Each test runs one scenario of the harness (tests/compat/java) in a JVM with a deadline and
judges its JSON events (tests/compat/checks.py): every sent key received, order per key,
filters, broadcast, delay level 3 at 10 +- 1 s, retry then DLQ, transaction checks, the
lite pull consumer. The same tests pass against the real RocketMQ
(``COMPAT_TARGET=reference``, see conftest.py).
"""

from __future__ import annotations

import pytest

from tests.compat import checks
from tests.compat.checks import first_deliveries, scenario
from tests.compat.targets import Target

pytestmark = [pytest.mark.cluster, pytest.mark.compat]



def test_sync_async_oneway_and_batch_sends_are_all_received(target: Target) -> None:
    checks.check_sends(scenario(target, "sends", count=10), 10)


def test_selector_sends_arrive_in_order_per_key_to_an_orderly_consumer(target: Target) -> None:
    checks.check_ordered(scenario(target, "ordered", count=25, keys=8), 8, 25)


def test_tag_subscription_gets_only_its_tags(target: Target) -> None:
    checks.check_tags(scenario(target, "tags", count=5), 5)


def test_sql92_subscription_gets_only_matching_properties(target: Target) -> None:
    checks.check_sql(scenario(target, "sql", count=5), 5)


def test_every_broadcast_consumer_gets_every_message(target: Target) -> None:
    checks.check_broadcast(scenario(target, "broadcast", count=10), 10)


def test_delay_level_3_arrives_after_ten_seconds(target: Target) -> None:
    checks.check_delay(scenario(target, "delay", count=3, level=3))


def test_reconsume_later_retries_then_dead_letters(target: Target) -> None:
    # one retry: RaftMQ retries on the group's schedule (first after 10 s), not the client's
    # delay level (docs/ROCKETMQ.md); the reference honours retryLevel=1 (1 s)
    run = scenario(target, "retry-dlq", count=3, maxReconsumeTimes=1, retryLevel=1)
    checks.check_retries(run, 3, 1)
    (dlq,) = run.of("dlq")
    assert dlq["count"] == 3 and dlq["topic"].startswith("%DLQ%cg-retry-dlq-")


def test_transactions_commit_roll_back_and_are_checked(target: Target) -> None:
    checks.check_transactions(scenario(target, "transaction", count=3, timeout_s=90), 3)


def test_lite_pull_consumer_polls_everything_and_commits(target: Target) -> None:
    run = scenario(target, "litepull", count=20)
    assert set(first_deliveries(run)) == {f"lite-{i}" for i in range(20)}
    assert len(run.of("committed")) == 1
