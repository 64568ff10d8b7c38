"""Stored message format: exact round trips; anything else is a MessageFormatError."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.message_format import Message, MessageFormatError, decode_message, encode_message

text = st.text(max_size=20)
messages = st.builds(
    Message, topic=text, body=st.binary(max_size=200), queue_id=st.integers(0, 1023),
    tags=st.none() | text, keys=st.lists(text, max_size=3).map(tuple),
    properties=st.dictionaries(text, text, max_size=3), msg_id=st.binary(min_size=16, max_size=16),
    flag=st.integers(0, 2**31), born_ts_ms=st.integers(0, 2**45), born_host=text,
    reconsume=st.integers(0, 100))


@given(messages)
def test_round_trip(m: Message) -> None:
    assert decode_message(encode_message(m)) == m


def test_idempotent_fields_travel_together() -> None:
    m = Message("t", b"x", producer_id="p1", sequence=7)
    assert decode_message(encode_message(m)).sequence == 7
    row = msgpack.unpackb(encode_message(m))
    row[11] = None  # sequence without producer
    with pytest.raises(MessageFormatError, match="together"):
        decode_message(msgpack.packb(row, use_bin_type=True))


@given(st.binary(max_size=64))
def test_garbage_raises_only_message_format_error(data: bytes) -> None:
    with contextlib.suppress(MessageFormatError):  # any other exception fails the test
        decode_message(data)
