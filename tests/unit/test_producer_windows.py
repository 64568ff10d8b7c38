"""Idempotent producers' windows (broker/state/producers.py): a replica's answer to a resend
depends only on the committed history -- never on when that replica last checkpointed."""

from __future__ import annotations

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
