"""github.com/apache/rocketmq-client-go/v2, unchanged, against RaftMQ (issue 27): the Go
harness (tests/compat/go) runs the Java harness's scenarios it has (no lite pull; the
retry scenario stops at the retries) and is judged by the same checks (checks.py). The
same tests pass against the real RocketMQ (``COMPAT_TARGET=reference``)."""

from __future__ import annotations

import pytest

from tests.compat import checks
from tests.compat.checks import scenario
from tests.compat.targets import Target

pytestmark = [pytest.mark.cluster, pytest.mark.compat]

def test_go_sync_async_oneway_and_batch_sends_are_all_received(target: Target) -> None:
    checks.check_sends(scenario(target, "sends", client="go", count=10), 10)


def test_go_sharding_key_sends_arrive_in_order_to_an_orderly_consumer(target: Target) -> None:
    checks.check_ordered(scenario(target, "ordered", client="go", count=25, keys=8), 8, 25)


def test_go_tag_and_sql92_subscriptions_filter(target: Target) -> None:
    checks.check_tags(scenario(target, "tags", client="go", count=5), 5)
    checks.check_sql(scenario(target, "sql", client="go", count=5), 5)


def test_go_broadcast_consumers_each_get_every_message(target: Target) -> None:
    checks.check_broadcast(scenario(target, "broadcast", client="go", count=10), 10)


def test_go_delay_level_3_arrives_after_ten_seconds(target: Target) -> None:
    checks.check_delay(scenario(target, "delay", client="go", count=3, level=3))


def test_go_reconsume_later_is_retried_with_growing_reconsume_times(target: Target) -> None:
    run = scenario(target, "retry", client="go", count=3, maxReconsumeTimes=1, retryLevel=1)
    checks.check_retries(run, 3, 1)


def test_go_transactions_commit_roll_back_and_are_checked(target: Target) -> None:
    checks.check_transactions(scenario(target, "transaction", client="go", count=3, timeout_s=90), 3)
