"""Stored message format: exact round trips; anything else is a MessageFormatError."""

from __future__ import annotations

import contextlib
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
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


# -- the msgspec decoder gives the verdict the first decoder gave ------------------------------
# The apply step of every replica decodes each message: a replica on this version and one on
# the version before must agree on which bytes are a message. ``_first_decoder`` is that
# version's decoder (msgpack, then type checks), kept here as the oracle.

def _first_decoder(data: bytes) -> Message:
    try:
        row = msgpack.unpackb(data, use_list=False, raw=False, strict_map_key=True)
    except Exception as e:
        raise MessageFormatError(str(e)) from None
    if not isinstance(row, tuple) or len(row) != 14 or row[0] != 1:
        raise MessageFormatError("not a version-1 message")
    (_, msg_id, topic, queue_id, flag, tags, keys, props, born, host, pid, seq, reconsume, body) = row
    ok = (type(msg_id) is bytes and len(msg_id) == 16 and type(topic) is str and type(host) is str
          and all(type(v) is int for v in (queue_id, flag, born, reconsume))
          and (tags is None or type(tags) is str) and type(keys) is tuple and type(props) is dict
          and type(body) is bytes
          and ((pid is None and seq is None) or (type(pid) is str and type(seq) is int))
          and all(type(k) is str for k in keys)
          and all(type(k) is str and type(v) is str for k, v in props.items()))
    if not ok:
        raise MessageFormatError("malformed")
    return Message(topic, body, queue_id, tags, keys, props, msg_id, flag, born, host, pid, seq, reconsume)


odd_values = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
              | st.text(max_size=4) | st.binary(max_size=17) | st.lists(st.text(max_size=2), max_size=2)
              | st.lists(st.integers(0, 3), max_size=2)
              | st.dictionaries(st.text(max_size=2), st.text(max_size=2), max_size=2)
              | st.dictionaries(st.integers(0, 3), st.text(max_size=2), max_size=1)
              | st.sampled_from([1, 1.0, True, b"\x00" * 16, (), {}]))


@settings(max_examples=600)
@given(messages, st.lists(st.tuples(st.integers(0, 14), odd_values), max_size=3), st.integers(-1, 1))
def test_the_verdict_on_any_bytes_is_the_first_decoders(m: Message, changes: list[tuple[int, Any]],
                                                         resize: int) -> None:
    row = list(msgpack.unpackb(encode_message(m)))
    for index, value in changes:
        if index < len(row):
            row[index] = value
    if resize < 0:
        row.pop()
    elif resize > 0:
        row.append(0)
    data = msgpack.packb(row, use_bin_type=True)
    try:
        expected: Message | None = _first_decoder(data)
    except MessageFormatError:
        expected = None
    try:
        got: Message | None = decode_message(data)
    except MessageFormatError:
        got = None
    assert got == expected


def test_peek_topic_reads_the_topic_without_decoding_the_rest() -> None:
    from protocol.message_format import peek_topic

    for topic in ("t", "x" * 31, "y" * 32, "%RETRY%" + "g" * 255):
        data = encode_message(Message(topic, b"body" * 1000))
        assert peek_topic(data) == topic
        assert peek_topic(data[:30 + len(topic)]) == topic  # only the head is read
    assert peek_topic(b"") is None and peek_topic(b"\x9e\x01garbage") is None
    assert peek_topic(msgpack.packb([1, b"\x00" * 16, "via-msgpack"] + [0] * 11)) == "via-msgpack"
