"""Records (protocol.record_batch) and the record of one (protocol.message_format): exact
round trips; anything else is a MessageFormatError; what the broker reads of a record
(header, tag hashes, ids, keys) without its message section."""

from __future__ import annotations

import contextlib
import random
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.message_format import Message, MessageFormatError, decode_message, encode_message, message_at
from protocol.record_batch import (
    FLAG_SPECIAL,
    HEADER,
    decode_messages,
    encode_record,
    read_header,
    record_columns,
    record_count,
    record_properties,
)
from protocol.tags import tag_hash

text = st.text(max_size=20)
messages = st.builds(
    Message, topic=text, body=st.binary(max_size=200), queue_id=st.integers(0, 1023),
    tags=st.none() | text.filter(bool), keys=st.lists(text, max_size=3).map(tuple),
    properties=st.dictionaries(text, text, max_size=3), msg_id=st.binary(min_size=16, max_size=16),
    flag=st.integers(0, 2**31), born_ts_ms=st.integers(0, 2**45), born_host=text,
    reconsume=st.integers(0, 100))


@given(messages)
def test_round_trip(m: Message) -> None:
    assert decode_message(encode_message(m)) == m


def test_idempotent_fields_travel_together() -> None:
    m = Message("t", b"x", producer_id="p1", sequence=7)
    assert decode_message(encode_message(m)).sequence == 7
    with pytest.raises(ValueError, match="together"):
        encode_message(Message("t", b"x", producer_id="p1"))
    data = bytearray(encode_message(m))
    struct.pack_into(">q", data, 8, -1)  # base sequence gone, producer id still there
    with pytest.raises(MessageFormatError, match="together"):
        decode_message(bytes(data))


@given(st.binary(max_size=64))
def test_garbage_raises_only_message_format_error(data: bytes) -> None:
    with contextlib.suppress(MessageFormatError):  # any other exception fails the test
        decode_message(data)


@given(st.lists(messages, min_size=1, max_size=8), st.sampled_from([None, "zstd", "lz4"]),
       st.integers(-1, 2**40))
def test_a_record_of_many_round_trips_and_its_header_says_what_the_broker_needs(
        ms: list[Message], compression: str | None, base: int) -> None:
    entries = [(m.msg_id, m.born_ts_ms, m.flag, m.tags, m.keys, m.properties, m.reconsume, m.body)
               for m in ms]
    producer = None if base < 0 else "p-1"
    record = encode_record("orders", 3, entries, producer_id=producer, base_sequence=base,
                           born_host="h", compression=compression)
    h = read_header(record)
    assert (h.count, h.topic, h.queue_id, h.producer_id, h.base_sequence) == (
        len(ms), "orders", 3, producer, base)
    assert record_count(record) == len(ms)
    assert h.tag_hashes(record) == [tag_hash(m.tags) for m in ms]
    assert h.msg_ids(record) == [m.msg_id for m in ms]
    assert h.keys(record) == [m.keys for m in ms]
    got = decode_messages(record)
    assert [(g.msg_id, g.tags, g.keys, g.properties, g.born_ts_ms, g.body, g.flag, g.reconsume)
            for g in got] == [(m.msg_id, m.tags, m.keys, m.properties, m.born_ts_ms, m.body, m.flag,
                               m.reconsume) for m in ms]
    assert [g.sequence for g in got] == [None if base < 0 else base + i for i in range(len(ms))]
    assert record_properties(record) == [m.properties for m in ms]
    assert message_at(record, len(ms) - 1).body == ms[-1].body


def test_compression_keeps_the_header_readable_and_is_used_only_when_smaller() -> None:
    body = b"abcd" * 2000
    entries = [(bytes(16), 0, 0, "t", ("k",), {}, 0, body)] * 4
    plain = encode_record("t", 0, entries)
    for codec in ("zstd", "lz4"):
        packed = encode_record("t", 0, entries, compression=codec)
        assert len(packed) < len(plain) // 10
        assert read_header(packed).keys(packed) == [("k",)] * 4  # never compressed
        assert [m.body for m in decode_messages(packed)] == [body] * 4
    random_body = random.Random(1).randbytes(512)
    assert encode_record("t", 0, [(bytes(16), 0, 0, None, (), {}, 0, random_body)], compression="lz4")[1] == 0
    with pytest.raises(ValueError, match="compression"):
        encode_record("t", 0, entries, compression="zlib")


def test_special_properties_mark_the_record() -> None:
    for props, special in (({}, False), ({"region": "eu"}, False), ({"DELAY": "3"}, True),
                           ({"TRAN_MSG": "true"}, True), ({"__SENT_BACK": "g:1"}, True)):
        flags = read_header(encode_message(Message("t", b"x", properties=props))).flags
        assert bool(flags & FLAG_SPECIAL) == special


@pytest.mark.parametrize("change", ["kind", "count", "length", "codec", "section"])
def test_a_damaged_header_is_refused(change: str) -> None:
    data = bytearray(encode_record("t", 0, [(bytes(16), 0, 0, "a", (), {}, 0, b"body")]))
    fields = list(HEADER.unpack_from(data))
    if change == "kind":
        fields[0] = 1  # the format before: a msgpack message of one
    elif change == "count":
        fields[2] = 0
    elif change == "codec":
        fields[1] = 3
    elif change == "section":
        fields[11] += 1
    HEADER.pack_into(data, 0, *fields)
    if change == "length":
        data += b"\x00"
    with pytest.raises(MessageFormatError):
        decode_messages(bytes(data))


def test_a_record_of_many_is_not_a_message() -> None:
    record = encode_record("t", 0, [(bytes(16), 0, 0, None, (), {}, 0, b"a")] * 2)
    with pytest.raises(MessageFormatError, match="2 messages"):
        decode_message(record)
    with pytest.raises(MessageFormatError, match="no message 2"):
        message_at(record, 2)


@given(st.lists(messages, min_size=1, max_size=6), st.integers(0, 2**40))
def test_record_columns_are_the_messages_column_by_column(ms: list[Message], born: int) -> None:
    entries = [(m.msg_id, born + i, m.flag, m.tags, m.keys, m.properties, m.reconsume, m.body)
               for i, m in enumerate(ms)]
    record = encode_record("t", 1, entries)
    c = record_columns(record)
    got = decode_messages(record)
    assert list(c.born_ms) == [g.born_ts_ms for g in got] and list(c.bodies) == [g.body for g in got]
    assert list(c.tags) == [g.tags for g in got] and list(c.properties) == [g.properties for g in got]
    assert c.keys == [g.keys for g in got] and c.msg_ids_hex == [g.msg_id.hex() for g in got]
    assert list(c.flags) == [g.flag for g in got] and list(c.reconsumes) == [g.reconsume for g in got]


def test_peek_topic_reads_the_header_and_the_topic_only() -> None:
    from protocol.message_format import peek_topic
    record = encode_message(Message("orders-ü", b"x" * 100_000))
    assert peek_topic(record[:60]) == "orders-ü" and peek_topic(record) == "orders-ü"
    assert peek_topic(record[:46]) is None  # the topic is cut
    assert peek_topic(b"\x93\x01\x02") is None and peek_topic(b"") is None
    for topic in ("t", "x" * 31, "y" * 32, "%RETRY%" + "g" * 255):  # the longest: a group's
        data = encode_message(Message(topic, b"body" * 1000))
        assert peek_topic(data) == topic
        assert peek_topic(data[:HEADER.size + len(topic)]) == topic  # only the head is read
