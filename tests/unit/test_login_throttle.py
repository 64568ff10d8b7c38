"""protocol.login_throttle: free failures, doubling delays, the cap and the window (issue 25, row 7)."""

from __future__ import annotations

import scramp

from broker.security.scram_auth import AuthThrottled, PasswordRejected, ScramExchange
from broker.state.access import AccessTables
from client.credentials import scram_record
from protocol.login_throttle import (
    MAX_KEYS,
    SOURCE_FREE,
    USER_CAP,
    USER_FREE,
    WINDOW_S,
    LoginThrottle,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_free_failures_then_doubling_delays() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock)
    for _ in range(USER_FREE):
        assert throttle.check("alice", None) is None
        throttle.failed("alice", None)
    refused = throttle.check("alice", None)
    assert refused is not None and refused.kind == "user" and refused.retry_after_s == 1.0
    assert "too many failed authentications for user 'alice' (5)" in refused.message()
    clock.now += 1.0
    assert throttle.check("alice", None) is None
    throttle.failed("alice", None)
    clock.now += 1.5
    assert throttle.check("alice", None) is not None  # now 2 s
    clock.now += 0.5
    assert throttle.check("alice", None) is None
    assert throttle.check("bob", None) is None  # per user


def test_the_cap_holds_for_the_window_and_a_success_clears_the_user() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock)
    for _ in range(USER_CAP):
        throttle.failed("alice", None)
    clock.now += WINDOW_S - 1
    assert throttle.check("alice", None) is not None
    clock.now += 1
    assert throttle.check("alice", None) is None  # the window since the last failure passed
    for _ in range(USER_FREE):
        throttle.failed("alice", None)
    throttle.succeeded("alice")
    assert throttle.check("alice", None) is None


def test_a_source_is_throttled_across_user_names_and_a_success_does_not_clear_it() -> None:
    throttle = LoginThrottle(Clock())
    for i in range(SOURCE_FREE):
        throttle.failed(f"u{i}", "10.0.0.9")
    throttle.succeeded("u0")
    refused = throttle.check("root", "10.0.0.9")
    assert refused is not None and refused.kind == "source"
    assert "from 10.0.0.9" in refused.message()
    assert throttle.check("root", "10.0.0.8") is None


def test_invented_names_do_not_grow_it_without_bound() -> None:
    throttle = LoginThrottle(Clock())
    for i in range(MAX_KEYS + 50):
        throttle.failed(f"u{i}", None)
    assert len(throttle._users._last) == MAX_KEYS


def _alice_tables() -> AccessTables:
    record = scram_record("alice-password", iterations=4096)
    return AccessTables({"alice": [False, record.salt, record.iterations, record.stored_key,
                                   record.server_key]})


def test_exchanges_started_in_parallel_have_at_most_the_free_allowance_of_proofs_checked() -> None:
    """Issue 25, row 7 (second pass, G1): the throttle was asked only when an exchange
    started, so exchanges started before any failure was recorded all had their proofs
    checked (200 of 200 on a broker): ~256 connections per address past the cap."""
    tables = _alice_tables()
    throttle = LoginThrottle(Clock())
    exchanges, finals = [], []
    for _ in range(USER_FREE + 10):  # every exchange starts before any has failed
        exchange = ScramExchange(lambda: tables, b"k" * 32, throttle=throttle, source="10.0.0.9")
        client = scramp.ScramClient(["SCRAM-SHA-256"], "alice", "a-guess")
        client.set_server_first(exchange.start("SCRAM-SHA-256", client.get_client_first()))
        exchanges.append(exchange)
        finals.append(client.get_client_final())
    outcomes = []
    for exchange, final in zip(exchanges, finals, strict=True):
        try:
            exchange.finish(final)
        except AuthThrottled:
            outcomes.append("throttled")
        except PasswordRejected:
            outcomes.append("checked")
    assert outcomes.count("checked") == USER_FREE, outcomes
    assert outcomes.count("throttled") == 10


def test_attempts_in_flight_count_as_failures_until_they_end() -> None:
    """The console verifies a sign-in with an ``await`` between the check and the outcome:
    ``begin`` reserves the attempt, so parallel sign-ins get at most the free allowance."""
    throttle = LoginThrottle(Clock())
    began = [throttle.begin("alice", "10.0.0.9") for _ in range(USER_FREE + 3)]
    assert began[:USER_FREE] == [None] * USER_FREE
    assert all(refused is not None and refused.kind == "user" for refused in began[USER_FREE:])
    for _ in range(USER_FREE - 1):
        throttle.end("alice", "10.0.0.9", ok=False)
    throttle.end("alice", "10.0.0.9", ok=True)  # a success clears the user, the source keeps 4
    assert throttle.begin("alice", "10.0.0.9") is None
    throttle.end("alice", "10.0.0.9", ok=True)
    for i in range(SOURCE_FREE - USER_FREE + 1):
        assert throttle.begin(f"u{i}", "10.0.0.9") is None
    refused = throttle.begin("bob", "10.0.0.9")  # 4 failures and 6 in flight from the source
    assert refused is not None and refused.kind == "source"
