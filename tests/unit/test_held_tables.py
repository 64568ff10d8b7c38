"""The held-message tables of ``broker.state.held``: what a deleted topic takes with it, and
checkpoints written before the tables kept each message's topic."""

from __future__ import annotations

from broker.state.held import TRANSACTION_TIMEOUT_MS, Halves, Timers


def test_forgetting_a_topic_drops_only_its_transaction_halves() -> None:
    halves = Halves()
    halves.hold(100, 10, 1_000, "tx", "orders")
    halves.hold(200, 10, 1_000, "tx", "payments")
    assert halves.checked(100, 2_000)  # a check-back keeps the topic
    halves.forget_topic("orders")
    assert halves.positions() == [200]
    assert Halves(halves.state()).state() == {200: [10, 1_000 + TRANSACTION_TIMEOUT_MS, 0, "tx", "payments"]}


def test_older_checkpoint_forms_load_with_an_unknown_topic() -> None:
    halves = Halves({7: [10, 5, 1, "tx"]})
    halves.forget_topic("orders")
    assert halves.state() == {7: [10, 5, 1, "tx", ""]}
    timers = Timers({8: [10, 5]})
    assert timers.state() == {8: [10, 5, ""]}
