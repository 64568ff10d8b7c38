"""protocol/rocketmq against golden bytes written by RocketMQ 4.9.7's own classes
(tests/compat/golden/GoldenFrames.java, run by tests/compat/golden/generate.sh): every
frame, header, message and body decoded and encoded byte for byte."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import pytest

from protocol.rocketmq import bodies, fastjson, message
from protocol.rocketmq.codes import FrameFlag, RequestCode, ResponseCode, SerializeType
from protocol.rocketmq.frame import RemotingFrame, RocketFrameError, decode_frame, read_length
from protocol.rocketmq.headers import (
    HeaderError,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    SendMessageResponseHeader,
    send_header,
)

GOLDEN = Path(__file__).resolve().parents[1] / "compat" / "golden" / "encoded"
TYPES = ("json", "rocketmq")


def golden(name: str) -> bytes:
    return bytes.fromhex((GOLDEN / f"{name}.hex").read_text().strip())


def frame_of(name: str) -> RemotingFrame:
    data = golden(name)
    assert read_length(data[:4], 1 << 20) == len(data) - 4
    return decode_frame(data[4:])


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("name", ["send_v1", "send_v2", "send_response", "pull", "pull_response",
                                  "oneway", "error_response"])
def test_every_golden_frame_decodes_and_encodes_back_to_the_same_bytes(name: str, kind: str) -> None:
    frame = frame_of(f"{name}_{kind}")
    assert frame.serialize_type == SerializeType[kind.upper()]
    assert frame.encode() == golden(f"{name}_{kind}")


@pytest.mark.parametrize("kind", TYPES)
def test_a_send_request_reads_the_same_header_from_v1_and_v2_names(kind: str) -> None:
    v1, v2 = frame_of(f"send_v1_{kind}"), frame_of(f"send_v2_{kind}")
    assert (v1.code, v2.code) == (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2)
    h1, h2 = send_header(v1), send_header(v2)
    assert h1 == h2
    assert (h1.producer_group, h1.topic, h1.queue_id, h1.born_timestamp) == ("pg", "orders", 3, 1700000000123)
    assert message.parse_properties(h1.properties or "") == {"KEYS": "order-42", "TAGS": "paid"}
    assert v1.body == b"hello" and v1.opaque == 7 and not v1.is_response


@pytest.mark.parametrize("kind", TYPES)
def test_responses_made_here_are_the_bytes_a_java_broker_makes(kind: str) -> None:
    ext, order = SendMessageResponseHeader(msg_id="7F00000100002A9F0000000000001234", queue_id=3,
                                           queue_offset=42).to_ext()
    request = RemotingFrame(RequestCode.SEND_MESSAGE_V2, opaque=8, serialize_type=SerializeType[kind.upper()])
    reply = request.response(ResponseCode.SUCCESS, ext, remark="not set any response code", ext_order=order)
    if kind == "json":
        assert reply.encode() == golden(f"send_response_{kind}")
    else:  # GoldenFrames used the HashMap path; a broker's Netty encoder writes the header's fields
        # first (test_rocketmq_captured.py compares with what the real broker wrote)
        assert decode_frame(reply.encode()[4:]) == frame_of(f"send_response_{kind}")
    ext, order = PullMessageResponseHeader(suggest_which_broker_id=0, next_begin_offset=101, min_offset=0,
                                           max_offset=101).to_ext()
    pull = RemotingFrame(RequestCode.PULL_MESSAGE, opaque=9, serialize_type=SerializeType[kind.upper()])
    answer = pull.response(ResponseCode.PULL_NOT_FOUND, ext, b"\x01\x02\x03", "no new message", order)
    if kind == "json":
        assert answer.encode() == golden(f"pull_response_{kind}")
    else:
        assert decode_frame(answer.encode()[4:]) == frame_of(f"pull_response_{kind}")


def test_pull_header_and_flags() -> None:
    pull = PullMessageRequestHeader.from_ext(frame_of("pull_rocketmq").ext)
    assert (pull.consumer_group, pull.queue_offset, pull.max_msg_nums, pull.suspend_timeout_millis) == (
        "billing", 100, 32, 15000)
    assert pull.subscription == "paid || created" and pull.expression_type == "TAG"
    oneway = frame_of("oneway_json")
    assert oneway.is_oneway and oneway.flag == FrameFlag.ONEWAY and oneway.remark == "bye é"
    assert frame_of("error_response_rocketmq").is_response


def test_a_header_lacking_a_required_field_is_refused_naming_it() -> None:
    ext = dict(frame_of("pull_json").ext or {})
    del ext["queueOffset"]
    with pytest.raises(HeaderError, match="queueOffset"):
        PullMessageRequestHeader.from_ext(ext)
    ext["queueOffset"] = "x"
    with pytest.raises(HeaderError, match="queueOffset"):
        PullMessageRequestHeader.from_ext(ext)


@pytest.mark.parametrize("payload", [b"", b"\x00\x00", struct.pack(">I", 0x00FFFFFF) + b"{}",
                                     struct.pack(">I", 2) + b"[]", struct.pack(">I", 0x05000002) + b"{}",
                                     struct.pack(">I", 0x01000003) + b"abc",
                                     struct.pack(">I", 7) + b'{"a":1}'])
def test_malformed_frames_raise_only_the_codec_error(payload: bytes) -> None:
    with pytest.raises(RocketFrameError):
        decode_frame(payload)


def test_frame_length_is_bounded() -> None:
    with pytest.raises(RocketFrameError, match="exceeds"):
        read_length(struct.pack(">i", 2_000_000), 1_000_000)
    with pytest.raises(RocketFrameError):
        read_length(struct.pack(">i", -5), 1_000_000)


def test_the_stored_message_layout_is_messagedecoders() -> None:
    (stored,) = message.decode_stored(golden("stored_message"))
    assert (stored.topic, stored.body, stored.queue_id, stored.queue_offset) == ("orders", b"paid: 42", 2, 17)
    assert stored.commit_log_offset == 123456789 and stored.store_host == ("127.0.0.1", 10911)
    assert stored.born_host == ("127.0.0.1", 50123) and stored.reconsume_times == 1
    # put in the order Java's setTags, setKeys, putUserProperty put them
    again = dataclasses.replace(stored, properties={"TAGS": "paid", "KEYS": "order-42 order-43",
                                                     "region": "eu", "amount": "120"})
    assert message.encode_stored(again) == golden("stored_message")
    assert message.properties_string(again.properties).encode() == golden("stored_message_properties")


def test_message_ids_are_store_host_and_offset() -> None:
    assert message.message_id(("127.0.0.1", 10911), 123456789) == golden("message_id").decode()
    assert message.decode_message_id(golden("message_id").decode()) == (("127.0.0.1", 10911), 123456789)


def test_a_batch_body_decodes_and_encodes_back() -> None:
    batch = message.decode_batch(golden("batch_body"))
    assert [m.body for m in batch] == [b"body-0", b"body-1", b"body-2"]
    assert batch[1].properties == {"KEYS": "k1", "WAIT": "true", "TAGS": "t1"}
    assert b"".join(message.encode_batch_message(m) for m in batch) == golden("batch_body")
    with pytest.raises(message.MessageFormatError):
        message.decode_batch(golden("batch_body")[:-3])


def test_routes_cluster_info_and_topic_lists_are_fastjsons_bytes() -> None:
    broker = bodies.BrokerData("RaftMQ", "group-a", {0: "127.0.0.1:10911", 1: "127.0.0.1:10921",
                                                     2: "127.0.0.1:10931"})
    queues = [bodies.QueueData("group-a", 8, 8)]
    assert bodies.topic_route(queues, [broker]) == golden("route_fastjson")  # bare Long keys
    assert bodies.topic_route(queues, [broker], standard=True) == golden("route_standard")
    assert bodies.cluster_info([broker]) == golden("cluster_info")
    assert bodies.topic_list(["orders", "payments"]) == golden("topic_list")
    assert int(golden("version_v4_9_4")) == bodies.V4_9_4
    assert fastjson.loads(golden("route_fastjson"))["brokerDatas"][0]["brokerAddrs"]["1"] == "127.0.0.1:10921"


def test_heartbeats_and_lock_bodies() -> None:
    beat = bodies.decode_heartbeat(golden("heartbeat"))
    assert beat.client_id == "127.0.0.1@4242" and beat.producer_groups == ("pg",)
    (consumer,) = beat.consumers
    assert (consumer.group, consumer.message_model, consumer.consume_from_where) == (
        "billing", "CLUSTERING", "CONSUME_FROM_FIRST_OFFSET")
    assert consumer.subscriptions[0].expression == "paid || created"
    lock = bodies.decode_lock_batch(golden("lock_batch_request"))
    assert lock.queues == (bodies.MessageQueue("orders", "group-a", 1),)
    assert bodies.lock_batch_response(lock.queues) == golden("lock_batch_response")
    with pytest.raises(bodies.BodyError):
        bodies.decode_heartbeat(b"[1,2]")


def test_java_hashmap_order() -> None:
    assert fastjson.java_hash("paid") == 3433164  # "paid".hashCode() in the golden heartbeat
    assert fastjson.java_order(["orders", "payments"]) == ["payments", "orders"]
    assert fastjson.dumps(fastjson.JavaMap({"a": "\x01é"})) == '{"a":"\\u0001é"}'
    assert fastjson.dumps(fastjson.JavaMap({"a": "é"}), standard=True) == '{"a":"\\u00E9"}'


def test_every_truncation_of_golden_bytes_raises_only_the_codec_errors() -> None:
    stored, batch = golden("stored_message"), golden("batch_body")
    for cut in range(1, len(stored)):
        with pytest.raises(message.MessageFormatError):
            message.decode_stored(stored[:cut])
    for cut in range(1, len(batch)):
        if cut % 53 == 0:  # whole messages (53 bytes each): a valid shorter batch
            continue
        with pytest.raises(message.MessageFormatError):
            message.decode_batch(batch[:cut])
    frame = golden("send_v1_rocketmq")[4:]
    for cut in range(0, len(frame) - len(b"hello")):  # the body is what follows the header
        with pytest.raises(RocketFrameError):
            decode_frame(frame[:cut])
