"""protocol.login_throttle: free failures, doubling delays, the cap and the window (issue 25, row 7)."""

from __future__ import annotations

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
