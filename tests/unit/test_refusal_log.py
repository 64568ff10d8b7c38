"""RefusalLog: one warning per reason a minute, with how many were refused meanwhile; the
Throttle under it."""

from __future__ import annotations

import logging

import pytest

from common.refusal_log import RefusalLog, Throttle


def test_each_reason_is_logged_once_a_minute_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    refusals = RefusalLog(logging.getLogger("test.refusals"), "refused", clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "test.refusals"):
        for _ in range(3):
            refusals.note("bad", "1.2.3.4", "bad signature")
        refusals.note("other", "1.2.3.4", "stale")
        now[0] += 61
        refusals.note("bad", "5.6.7.8", "bad signature")
    assert [r.getMessage() for r in caplog.records] == [
        "refused 1.2.3.4: bad signature", "refused 1.2.3.4: stale",
        "refused 5.6.7.8: bad signature (2 more like it in the last minute)"]


def test_a_throttle_gives_each_key_a_turn_per_interval_with_the_skips_since() -> None:
    now = [-5.0]  # any clock: a key's first take is its turn
    turns = Throttle(10, clock=lambda: now[0])
    assert turns.take("a") == 0 and turns.take("b") == 0
    assert turns.take("a") is None and turns.take("a") is None
    now[0] += 9.9
    assert turns.take("a") is None
    now[0] += 0.2
    assert turns.take("a") == 3 and turns.take("a") is None and turns.take("b") == 0
