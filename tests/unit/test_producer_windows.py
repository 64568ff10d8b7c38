"""Idempotent producers' windows (broker/state/producers.py): a replica's answer to a resend
depends only on the committed history -- never on when that replica last checkpointed."""

from __future__ import annotations

import pytest

import broker.state.producers as producers
from broker.state.producers import RECENT_RECORDS, ProducerWindows

KEY = ("p.0", "t", 0)


def _windows(records: int) -> ProducerWindows:
    """``records`` records of two messages each, stored at queue offsets 0, 2, 4, ..."""
    windows = ProducerWindows()
    for i in range(records):
        assert windows.admit(KEY, 2 * i, 2, 1_000) is None
        windows.record(KEY, 2 * i, 2, 2 * i, 1_000)
    return windows


def test_a_resend_is_answered_alike_before_and_after_a_checkpoint_trims_the_window() -> None:
    records = RECENT_RECORDS + 144  # between the trims on record(): 256 < 400 <= 512
    untrimmed, trimmed = _windows(records), _windows(records)
    trimmed.forget_expired(1_000)  # what a checkpoint does, at a time of that replica's own
    for i in (0, 20, records - RECENT_RECORDS - 1, records - RECENT_RECORDS, records - 1):
        for base, count in ((2 * i, 2), (2 * i + 1, 2), (2 * i, 1)):  # as sent, shifted, partial
            a = untrimmed.admit(KEY, base, count, 1_000)
            b = trimmed.admit(KEY, base, count, 1_000)
            assert a == b, (i, base, count, a, b)
    # the last RECENT_RECORDS records are answered with their offsets, older ones with -1
    newest, oldest = untrimmed.admit(KEY, 2 * (records - 1), 2, 1_000), untrimmed.admit(KEY, 0, 2, 1_000)
    assert newest is not None and newest[:3] == ("duplicate", 0, 2 * (records - 1))
    assert oldest is not None and oldest[:3] == ("duplicate", 0, -1)


def _one_record_each(windows: ProducerWindows, producers: range, at_ms: int) -> None:
    for p in producers:
        key = (f"p.{p}", "t", 0)
        assert windows.admit(key, 0, 1, at_ms + p) is None
        windows.record(key, 0, 1, p, at_ms + p)  # written in this order


def test_the_windows_are_bounded_and_the_least_recently_written_go_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every new producer id made a window kept for a day: a client inventing ids (or a Spark
    sink, one id per batch and partition) grew the replicated state without a bound. At
    MAX_PRODUCER_WINDOWS the oldest-written tenth goes (forgotten as if expired: its next
    sequence must be 0); the others still answer a resend DUPLICATE."""
    monkeypatch.setattr(producers, "MAX_PRODUCER_WINDOWS", 100)
    windows = ProducerWindows()
    _one_record_each(windows, range(100), 1_000)
    _one_record_each(windows, range(100, 101), 2_000)  # the 101st: the oldest-written tenth goes
    state = windows.state()
    assert len(state) == 91
    assert "p.0\0t\x000" not in state and "p.9\0t\x000" not in state and "p.10\0t\x000" in state
    assert windows.admit(("p.5", "t", 0), 0, 1, 3_000) is None  # forgotten: 0 is new again
    kept = windows.admit(("p.50", "t", 0), 0, 1, 3_000)
    assert kept is not None and kept[0] == "duplicate"


def test_the_bound_decides_alike_whenever_a_replica_pruned_expired_windows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoints drop expired windows at each replica's own time, so replicas hold different
    numbers of windows; what the cap evicts must not depend on that (guarantee 4)."""
    monkeypatch.setattr(producers, "MAX_PRODUCER_WINDOWS", 100)
    day = producers.PRODUCER_EXPIRY_MS
    a, b = ProducerWindows(), ProducerWindows()
    for w in (a, b):
        _one_record_each(w, range(40), 1_000)  # expire a day later
        _one_record_each(w, range(40, 100), 1_000 + day // 2)
    b.forget_expired(2_000 + day)  # b's checkpoint ran: 60 windows; a still holds 100
    for w in (a, b):
        _one_record_each(w, range(100, 150), 2_000 + day)
    a.forget_expired(2_000 + day)
    b.forget_expired(2_000 + day)
    assert a.state() == b.state()
