"""Wire frames: exact round trips; any other input is a FrameError and nothing else."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.remoting import (
    DEFAULT_MAX_FRAME,
    MAX_CODE,
    MAX_EXT_ITEMS,
    MAX_OPAQUE,
    RETRIABLE,
    Frame,
    FrameError,
    FrameFlag,
    RequestCode,
    ResponseCode,
    decode_frame,
)

MALFORMED = ResponseCode.MALFORMED_FRAME

ALL_EXT = {
    "str": "héllo", "empty": "", "int": -5, "big": 2**64 - 1, "small": -(2**63), "bool": True,
    "false": False, "bytes": b"\x00\xff", "nil": None, "list": ["a", 1, True, b"b", None], "none": [],
}

ext_scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
               | st.text(max_size=20) | st.binary(max_size=20))
ext_values = ext_scalars | st.lists(ext_scalars, max_size=5)
frames = st.builds(
    Frame, code=st.integers(0, MAX_CODE), opaque=st.integers(0, MAX_OPAQUE),
    flags=st.sampled_from([0, 1, 2]), remark=st.text(max_size=30),
    ext=st.dictionaries(st.text(max_size=10), ext_values, max_size=6), body=st.binary(max_size=300))


def raw(*fields: Any) -> bytes:
    """Hand-made frame bytes, valid or not."""
    return msgpack.packb(list(fields), use_bin_type=True)


def decode_error(data: Any, max_frame_bytes: int = DEFAULT_MAX_FRAME) -> FrameError:
    with pytest.raises(FrameError) as caught:
        decode_frame(data, max_frame_bytes)
    return caught.value


def decode_or_frame_error(data: bytes) -> None:
    """Decoding may succeed or raise FrameError; any other exception fails the test."""
    try:
        frame = decode_frame(data)
    except FrameError as e:
        assert e.code in (ResponseCode.MALFORMED_FRAME, ResponseCode.MESSAGE_TOO_LARGE)
        assert str(e)
    else:
        assert decode_frame(frame.encode()) == frame


# -- round trips --------------------------------------------------------------------

def test_request_round_trip_with_every_ext_type() -> None:
    frame = Frame.request(RequestCode.SEND_MESSAGE, 42, ALL_EXT, b"payload")
    decoded = decode_frame(frame.encode())
    assert decoded == frame
    assert decoded.request_code() is RequestCode.SEND_MESSAGE
    assert decoded.response_code() is None
    assert not decoded.is_response and not decoded.is_oneway
    assert decoded.ext["list"] == ("a", 1, True, b"b", None)
    assert type(decoded.ext["bool"]) is bool and type(decoded.ext["int"]) is int
    assert decoded.encode() == frame.encode()


def test_response_round_trip() -> None:
    request = Frame.request(RequestCode.PULL_MESSAGE, MAX_OPAQUE, {"queueId": 3})
    response = request.response(ResponseCode.PULL_OFFSET_MOVED, {"nextOffset": 17}, b"", "moved")
    decoded = decode_frame(response.encode())
    assert decoded == response
    assert decoded.opaque == MAX_OPAQUE and decoded.is_response and not decoded.is_oneway
    assert decoded.flags == FrameFlag.RESPONSE
    assert decoded.response_code() is ResponseCode.PULL_OFFSET_MOVED
    assert decoded.request_code() is None
    assert decoded.remark == "moved"


def test_oneway_round_trip() -> None:
    frame = Frame.request(RequestCode.HEARTBEAT, 0, {"clientId": "c1"}, oneway=True)
    decoded = decode_frame(frame.encode())
    assert decoded == frame and decoded.is_oneway and not decoded.is_response


def test_server_to_client_request_round_trip() -> None:
    check = Frame.request(RequestCode.CHECK_TRANSACTION, 9, {"transactionId": "tx", "offset": 5})
    assert decode_frame(check.encode()).request_code() is RequestCode.CHECK_TRANSACTION


@settings(max_examples=200)
@given(frames)
def test_any_frame_round_trips_exactly(frame: Frame) -> None:
    decoded = decode_frame(frame.encode())
    assert decoded == frame
    assert decoded.encode() == frame.encode()  # also tells bool from int


def test_decode_accepts_bytearray_and_memoryview() -> None:
    data = Frame.request(RequestCode.GET_TOPICS, 1).encode()
    assert decode_frame(bytearray(data)) == decode_frame(memoryview(data)) == decode_frame(data)


def test_ext_is_read_only_and_copied() -> None:
    ext: dict[str, Any] = {"k": [1, 2]}
    frame = Frame.request(RequestCode.QUERY_OFFSET, 1, ext)
    ext["k"].append(3)
    ext["new"] = 1
    assert dict(frame.ext) == {"k": (1, 2)}
    with pytest.raises(TypeError):
        frame.ext["k"] = 0  # type: ignore[index]


# -- codes ---------------------------------------------------------------------------

def test_unknown_request_code_decodes() -> None:
    frame = decode_frame(raw(1, 9999, 77, 0, "", {}, b""))
    assert frame.code == 9999 and frame.opaque == 77
    assert frame.request_code() is None
    assert frame.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED).opaque == 77


def test_unknown_response_code_decodes() -> None:
    frame = decode_frame(raw(1, 999, 1, 1, "", {}, b""))
    assert frame.response_code() is None


def test_code_values_are_fixed() -> None:
    assert {c.name: c.value for c in RequestCode} == {
        "SEND_MESSAGE": 10, "SEND_BATCH": 11, "PULL_MESSAGE": 12, "QUERY_MESSAGE": 13,
        "VIEW_MESSAGE_BY_ID": 14, "QUERY_BY_TIME": 15, "SEARCH_OFFSET": 16,
        "COMMIT_OFFSET": 20, "QUERY_OFFSET": 21,
        "RESET_OFFSET": 22, "HEARTBEAT": 30, "UNREGISTER_CLIENT": 31, "GET_CONSUMER_LIST": 32,
        "CONSUMER_SEND_MSG_BACK": 33, "LOCK_BATCH_MQ": 34, "UNLOCK_BATCH_MQ": 35,
        "POP_MESSAGE": 36, "ACK_MESSAGE": 37, "CHANGE_INVISIBLE_DURATION": 38, "NACK_MESSAGE": 39,
        "GET_ROUTE": 40, "CREATE_TOPIC": 50, "DELETE_TOPIC": 51, "GET_TOPICS": 52, "UPDATE_GROUP_CONFIG": 53,
        "END_TRANSACTION": 60, "CHECK_TRANSACTION": 61, "NOTIFY_CONSUMER_IDS_CHANGED": 62,
        "AUTH_START": 70, "AUTH_FINISH": 71, "PUT_USER": 72, "DELETE_USER": 73, "LIST_USERS": 74,
        "GRANT": 75, "REVOKE": 76, "LIST_POLICIES": 77, "PUT_ACCESS_KEY": 78, "REVOKE_ACCESS_KEY": 79,
        "LIST_ACCESS_KEYS": 80}
    assert [c.value for c in ResponseCode] == list(range(22))
    assert ResponseCode.AUTH_FAILED == 20 and not ResponseCode.AUTH_FAILED.retriable
    assert not ResponseCode.NO_PERMISSION.retriable
    assert ResponseCode.SUCCESS == 0 and ResponseCode.SUBSCRIPTION_INVALID == 19
    assert ResponseCode.DISK_FULL == 21 and ResponseCode.DISK_FULL.retriable
    assert ResponseCode(8) is ResponseCode.NOT_LEADER


def test_every_response_code_has_a_meaning_and_retriability() -> None:
    for code in ResponseCode:
        assert code.meaning and "\n" not in code.meaning
        assert code.retriable == (code in RETRIABLE)
    assert ResponseCode.NOT_LEADER.retriable and ResponseCode.SYSTEM_BUSY.retriable
    assert not ResponseCode.MALFORMED_FRAME.retriable and not ResponseCode.INVALID_NAME.retriable
    assert ResponseCode.SUCCESS not in RETRIABLE


# -- refused frames ----------------------------------------------------------------------

@pytest.mark.parametrize(("data", "fragment", "opaque"), [
    (b"", "frame is empty", None),
    (b"\xc1", "a frame is a msgpack array", None),
    (raw(), "empty array", None),
    (msgpack.packb({"version": 1}), "a frame is a msgpack array", None),
    (b"\x97", "frame ends inside field 'version'", None),
    (b"\xdd\x00", "frame ends inside its array header", None),
    (raw(2, 10, 5, 0, "", {}, b""), "unsupported frame version 2", 5),  # answered on its opaque
    (raw(True, 10, 5, 0, "", {}, b""), "unsupported frame version True", 5),
    (raw(1, 10, 5, 0, "", {}, b"", b"extra"), "frame has 8 fields; expected 7", 5),
    (raw(1, 10, 5, 0, "", {}), "frame has 6 fields; expected 7", 5),
    (raw(1, 10), "frame has 2 fields", None),
    (raw(1, 10, 5, 4, "", {}, b""), "flags must be 0, 1 (RESPONSE) or 2 (ONEWAY), got 4", 5),
    (raw(1, 10, 5, 3, "", {}, b""), "got 3", 5),
    (raw(1, 10, 5, -1, "", {}, b""), "flags", 5),
    (raw(1, 10, -1, 0, "", {}, b""), f"opaque must be an int in 0..{MAX_OPAQUE}, got -1", None),
    (raw(1, 10, 2**32, 0, "", {}, b""), "opaque must be", None),
    (raw(1, 10, True, 0, "", {}, b""), "opaque must be", None),
    (raw(1, 10, 1.5, 0, "", {}, b""), "opaque must be", None),
    (raw(1, "10", 5, 0, "", {}, b""), "code must be an int", 5),
    (raw(1, -1, 5, 0, "", {}, b""), "code must be an int", 5),
    (raw(1, 2**31, 5, 0, "", {}, b""), "code must be an int", 5),
    (raw(1, 10, 5, 0, b"bin", {}, b""), "remark must be a str, got bytes", 5),
    (raw(1, 10, 5, 0, "", [], b""), "ext must be a map, got list", 5),
    (raw(1, 10, 5, 0, "", {}, "text"), "body must be bytes, got str", 5),
    (raw(1, 10, 5, 0, "", {1: "x"}, b""), "cannot read field 'ext'", 5),
    (raw(1, 10, 5, 0, "", {b"k": "x"}, b""), "ext keys must be str, got bytes", 5),
    (raw(1, 10, 5, 0, "", {"k": 1.5}, b""), "ext field 'k' has unsupported type float", 5),
    (raw(1, 10, 5, 0, "", {"k": {"a": 1}}, b""), "ext field 'k' has unsupported type map", 5),
    (raw(1, 10, 5, 0, "", {"k": [[1]]}, b""), "holds a list in its list", 5),
    (raw(1, 10, 5, 0, "", {"k": [{"a": 1}]}, b""), "holds a map in its list", 5),
    (raw(1, 10, 5, 0, "", {}, b"") + b"\x00", "1 trailing byte after the frame", 5),
    (raw(1, 10, 5, 0, "", {}, b"") + b"\x00\x00", "2 trailing bytes", 5),
    (raw(1, 10, 5, 0, "", {"t": msgpack.ExtType(1, b"x")}, b""), "max_ext_len", 5),
])
def test_malformed_frames(data: bytes, fragment: str | None, opaque: int | None) -> None:
    error = decode_error(data)
    assert error.code is MALFORMED
    assert str(error).startswith("malformed frame: ")
    if fragment is not None:
        assert fragment in str(error)
    if opaque is not None:
        assert error.opaque == opaque


def test_invalid_utf8_is_malformed_and_keeps_the_opaque() -> None:
    good = raw(1, 10, 5, 0, "ab", {}, b"")
    bad = good.replace(b"\xa2ab", b"\xa2\xff\xfe")
    error = decode_error(bad)
    assert error.code is MALFORMED and error.opaque == 5 and "field 'remark'" in str(error)


def test_non_bytes_input_is_malformed() -> None:
    for value in (None, "text", 5, [1, 2], object()):
        assert decode_error(value).code is MALFORMED


def test_deeply_nested_ext_value_is_refused() -> None:
    for depth in (2, 100, 10_000, 200_000):
        nested = b"\x91" * depth + b"\x01"
        data = raw(1, 10, 5, 0, "", {}, b"")
        data = data.replace(b"\x80", b"\x81\xa1k" + nested)  # ext = {"k": [[[...1]]]}
        error = decode_error(data)
        assert error.code is MALFORMED and error.opaque == 5


def test_declared_huge_arrays_and_maps_are_refused_before_allocation() -> None:
    for header in (b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdc\xff\xff"):
        data = b"\x97\x01\x0a\x05\x00\xa0\x81\xa1k" + header * 2000
        error = decode_error(data)
        assert error.code is MALFORMED and error.opaque == 5
        assert "exceeds max_" in str(error)


def test_declared_huge_strings_and_binaries_are_refused() -> None:
    for header in (b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff"):
        error = decode_error(b"\x97\x01\x0a\x05\x00\xa0\x80" + header + b"x")
        assert error.code is MALFORMED and error.opaque == 5


def test_too_many_ext_fields_or_list_items() -> None:
    fields = {f"k{i}": i for i in range(MAX_EXT_ITEMS + 1)}
    assert decode_error(raw(1, 10, 5, 0, "", fields, b"")).opaque == 5
    items = list(range(MAX_EXT_ITEMS + 1))
    assert decode_error(raw(1, 10, 5, 0, "", {"k": items}, b"")).opaque == 5
    at_limit = {f"k{i}": list(range(MAX_EXT_ITEMS)) for i in range(2)}
    assert decode_frame(raw(1, 10, 5, 0, "", at_limit, b"")).ext["k1"][-1] == MAX_EXT_ITEMS - 1


# -- size limit ---------------------------------------------------------------------------

def test_frame_over_the_size_limit_is_message_too_large() -> None:
    frame = Frame.request(RequestCode.SEND_MESSAGE, 31337, {"topic": "t"}, b"x" * DEFAULT_MAX_FRAME)
    error = decode_error(frame.encode())
    assert error.code is ResponseCode.MESSAGE_TOO_LARGE
    assert f"exceeds the {DEFAULT_MAX_FRAME}-byte limit" in str(error)
    assert error.opaque == 31337 and error.flags == 0
    reply = error.response()
    assert reply is not None and reply.opaque == 31337
    assert reply.response_code() is ResponseCode.MESSAGE_TOO_LARGE


def test_the_limit_is_inclusive() -> None:
    data = Frame.request(RequestCode.SEND_MESSAGE, 1, body=b"x" * 1000).encode()
    assert decode_frame(data, max_frame_bytes=len(data)).body == b"x" * 1000
    assert decode_error(data, max_frame_bytes=len(data) - 1).code is ResponseCode.MESSAGE_TOO_LARGE


def test_a_4_mib_body_fits_the_default_limit() -> None:
    frame = Frame.request(RequestCode.SEND_BATCH, 1, {"topic": "t" * 127}, bytes(4 * 1024 * 1024))
    assert decode_frame(frame.encode()) == frame


def test_oversized_garbage_is_message_too_large_without_opaque() -> None:
    error = decode_error(b"\xff" * 200, max_frame_bytes=100)
    assert error.code is ResponseCode.MESSAGE_TOO_LARGE and error.opaque is None
    assert error.response() is None


# -- answering a bad frame -------------------------------------------------------------------

def test_error_response_only_for_plain_requests() -> None:
    request_error = decode_error(raw(1, 10, 5, 0, "", {"k": 1.5}, b""))
    reply = request_error.response()
    assert reply is not None
    assert (reply.opaque, reply.is_response, reply.code) == (5, True, MALFORMED)
    assert "unsupported type float" in reply.remark
    for flags in (FrameFlag.RESPONSE, FrameFlag.ONEWAY):
        error = decode_error(raw(1, 10, 5, int(flags), "", {"k": 1.5}, b""))
        assert error.opaque == 5 and error.flags == flags
        assert error.response() is None  # nobody waits for an answer under that opaque
    unreadable = decode_error(raw(1, 10, 5, 8, "", {}, b""))
    assert unreadable.flags is None and unreadable.response() is None


def test_responses_and_oneways_cannot_be_answered() -> None:
    response = Frame.request(RequestCode.GET_ROUTE, 3).response(ResponseCode.SUCCESS)
    with pytest.raises(ValueError, match="response cannot be answered"):
        response.response(ResponseCode.SUCCESS)
    oneway = Frame.request(RequestCode.HEARTBEAT, 3, oneway=True)
    with pytest.raises(ValueError, match="oneway request cannot be answered"):
        oneway.response(ResponseCode.SUCCESS)


def test_enum_codes_are_stored_as_plain_ints() -> None:
    frame = Frame(RequestCode.GET_ROUTE, 1, FrameFlag.ONEWAY)
    assert type(frame.code) is int and type(frame.flags) is int
    assert frame.request_code() is RequestCode.GET_ROUTE


@pytest.mark.parametrize("kwargs", [
    {"code": 10, "opaque": -1}, {"code": 10, "opaque": 2**32}, {"code": -1, "opaque": 0},
    {"code": 10, "opaque": 0, "flags": 3}, {"code": 10, "opaque": 0, "flags": 8},
    {"code": 10, "opaque": 0, "remark": None}, {"code": 10, "opaque": 0, "body": "text"},
    {"code": 10, "opaque": 0, "body": bytearray(b"x")}, {"code": 10, "opaque": 0, "version": 2},
    {"code": 10, "opaque": 0, "ext": {"k": 1.0}}, {"code": 10, "opaque": 0, "ext": {"k": 2**64}},
    {"code": 10, "opaque": 0, "ext": {"k": [-(2**63) - 1]}}, {"code": 10, "opaque": 0, "ext": {1: 1}},
    {"code": 10, "opaque": 0, "ext": {"k": [[1]]}}, {"code": True, "opaque": 0},
    {"code": "10", "opaque": 0},
])
def test_invalid_frames_cannot_be_built(kwargs: dict[str, Any]) -> None:
    with pytest.raises(FrameError) as caught:
        Frame(**kwargs)
    assert caught.value.code is MALFORMED


# -- robustness: only FrameError, whatever the bytes ---------------------------------------------

SAMPLE = Frame.request(RequestCode.SEND_MESSAGE, 0xDEADBEEF, ALL_EXT, b"body bytes").encode()


def test_every_truncation_is_malformed() -> None:
    for length in range(len(SAMPLE)):
        error = decode_error(SAMPLE[:length])
        assert error.code is MALFORMED
        if length >= 8:  # array header, version, code and the uint32 opaque are in
            assert error.opaque == 0xDEADBEEF


@settings(max_examples=200)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_frame_error(data: bytes) -> None:
    decode_or_frame_error(data)


@settings(max_examples=200)
@given(st.binary(max_size=60))
def test_arbitrary_bytes_after_a_valid_head_raise_only_frame_error(tail: bytes) -> None:
    decode_or_frame_error(b"\x97\x01\x0a\x05\x00" + tail)


@settings(max_examples=200)
@given(frames, st.data())
def test_truncated_frames_raise_frame_error(frame: Frame, data: st.DataObject) -> None:
    encoded = frame.encode()
    cut = data.draw(st.integers(0, len(encoded) - 1))
    assert decode_error(encoded[:cut]).code is MALFORMED


@settings(max_examples=200)
@given(frames, st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4))
def test_flipped_bytes_raise_only_frame_error(frame: Frame, flips: list[tuple[int, int]]) -> None:
    mutated = bytearray(frame.encode())
    for position, value in flips:
        mutated[position % len(mutated)] = value
    decode_or_frame_error(bytes(mutated))


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: (st.lists(inner, max_size=4)
                   | st.dictionaries(st.text(max_size=4) | st.integers(-9, 9), inner, max_size=3)),
    max_leaves=12)


@settings(max_examples=200)
@given(st.lists(msgpack_values, max_size=9), st.booleans())
def test_arbitrary_msgpack_arrays_raise_only_frame_error(fields: list[Any], versioned: bool) -> None:
    if versioned:
        fields = [1, *fields]
    decode_or_frame_error(msgpack.packb(fields, use_bin_type=True))


_EXT_ATOMS = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
              | st.text(max_size=5) | st.binary(max_size=5) | st.floats(allow_nan=False))
_EXT_VALUES = _EXT_ATOMS | st.lists(_EXT_ATOMS | st.lists(st.integers(), max_size=2), max_size=4)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(max_size=4) | st.integers(), _EXT_VALUES, max_size=6))
def test_the_fast_ext_check_agrees_with_the_explained_one(ext: dict[Any, Any]) -> None:
    """Frames check a valid ext without formatting any message (``_plain_ext``); whatever it
    accepts the item-by-item check accepts identically, and whatever it cannot accept goes to
    the item-by-item check, which names the fault."""
    from protocol.remoting.frame import _checked_ext_explained, _plain_ext

    plain = _plain_ext(ext)
    try:
        explained = _checked_ext_explained(ext)
    except FrameError:
        assert plain is None
    else:
        assert plain is None or plain == explained
        assert Frame.request(1, 1, ext).ext == explained
