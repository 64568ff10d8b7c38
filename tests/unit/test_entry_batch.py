"""Entry batches: order kept, every entry under the limit, stamp carried."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.store.entry_batch import MessageTooLarge, max_message_bytes, pack_entries, unpack_entry
from dledger.config import MAX_ENTRY_BYTES


@given(st.lists(st.binary(max_size=20_000), max_size=40), st.integers(0, 2**63 - 1))
def test_round_trip_keeps_order_and_limit(messages: list[bytes], stamp: int) -> None:
    payloads = pack_entries(messages, stamp)
    assert all(len(p) <= MAX_ENTRY_BYTES for p in payloads)
    batches = [unpack_entry(p) for p in payloads]
    assert [m for b in batches for m in b.messages] == messages
    assert all(b.store_timestamp_ms == stamp for b in batches)


def test_biggest_message_fits_alone() -> None:
    (payload,) = pack_entries([b"x" * max_message_bytes()], 1)
    assert len(payload) <= MAX_ENTRY_BYTES
    with pytest.raises(MessageTooLarge, match="entry limit"):
        pack_entries([b"x" * (max_message_bytes() + 1)], 1)


def test_small_messages_share_an_entry() -> None:
    assert len(pack_entries([b"m" * 256] * 200, 5)) == 1


@pytest.mark.parametrize("bad", [b"", b"\x93\x01\x01\x90", b"\x93\x03\x01\x90", b"\xc1"])
def test_garbage_is_refused(bad: bytes) -> None:
    with pytest.raises(ValueError):
        unpack_entry(bad)


@given(st.lists(st.binary(max_size=3000), max_size=30), st.integers(0, 2**40))
def test_locate_messages_points_at_each_message(messages: list[bytes], stamp: int) -> None:
    from broker.store.entry_batch import locate_messages

    for payload in pack_entries(messages, stamp) or [pack_entries([b""], stamp)[0]]:
        got_stamp, spans = locate_messages(payload)
        assert got_stamp == stamp
        assert [payload[o:o + n] for o, n in spans] == list(unpack_entry(payload).messages)


def test_locate_refuses_garbage() -> None:
    from broker.store.entry_batch import locate_messages

    for bad in (b"", b"\x93\x01\x05\x91\x01", b"\x93\x01\x05\x90\xc0", b"\x92\x01\x02"):
        with pytest.raises(ValueError):
            locate_messages(bad)
