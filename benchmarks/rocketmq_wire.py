"""``python -m benchmarks.rocketmq_wire``: CPU per frame of the RocketMQ front end's wire
work (issue 27), one thread, no network, each step the best of ``--repeat`` timeit rounds::

    send  the broker: bytes of a SEND_MESSAGE_V2 (JSON header, as the Java client sends it)
          -> RemotingFrame -> the send header -> a RaftMQ message -> its record of one;
          the answer -> bytes
    batch the broker: a SEND_BATCH_MESSAGE body of N messages -> N RaftMQ messages -> one record
    pull  the broker: a page of one record of N messages -> N stored messages -> bytes
          (what the front end adds to the native pull)

Figures are microseconds per frame and per message.
"""

from __future__ import annotations

import argparse
import os
import timeit
from collections.abc import Callable

from broker.rocketmq.sends import batch_records
from broker.rocketmq.translate import batch_messages, native_message, send_properties, stored_message
from protocol.message_format import encode_message
from protocol.record_batch import decode_messages, encode_record
from protocol.rocketmq.codes import RequestCode, ResponseCode
from protocol.rocketmq.frame import RemotingFrame, decode_frame
from protocol.rocketmq.headers import (
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    reply,
    send_header,
    v2_ext,
)
from protocol.rocketmq.message import BatchMessage, decode_batch, encode_batch_message, encode_stored

__all__ = ["main"]

HOST = ("127.0.0.1", 10911)


def _send_frame(body: bytes) -> bytes:
    header = SendMessageRequestHeader(producer_group="pg", topic="bench", default_topic="TBW102",
                                      default_topic_queue_nums=4, queue_id=3, sys_flag=0,
                                      born_timestamp=1_795_000_000_000, flag=0, reconsume_times=0,
                                      properties="KEYS\x01k1\x02UNIQ_KEY\x01" + os.urandom(16).hex().upper()
                                      + "\x02WAIT\x01true\x02TAGS\x01tagA")
    ext = v2_ext(header)[0]
    return RemotingFrame(RequestCode.SEND_MESSAGE_V2, 7, 0, None, ext, body, version=407).encode()


def _broker_send(data: bytes) -> bytes:
    frame = decode_frame(data[4:])
    h = send_header(frame)
    m = native_message(h.topic, h.queue_id, frame.body, send_properties(h.properties), flag=h.flag,
                       born_ms=h.born_timestamp, born_host="127.0.0.1:50000")
    encode_message(m)
    answer = SendMessageResponseHeader(msg_id="7F00000100002A9F0000000000001234", queue_id=3, queue_offset=42,
                                       trace_on=True, msg_region="DefaultRegion")
    return reply(frame, ResponseCode.SUCCESS, answer).encode()


def measure(count: int, body_bytes: int, repeat: int) -> dict[str, float]:
    body = os.urandom(body_bytes)
    send = _send_frame(body)
    batch = b"".join(encode_batch_message(BatchMessage(0, body, {"KEYS": f"k{i}", "WAIT": "true"}))
                     for i in range(count))
    record = encode_record("bench", 3, [(os.urandom(16), 1_795_000_000_000, 0, "tagA", ("k1",), {}, 0, body)
                                        for _ in range(count)])

    def batch_step() -> None:
        batch_records(batch_messages("bench", 3, decode_batch(batch), born_ms=1, born_host="127.0.0.1:1"))

    def pull_step() -> None:
        messages = decode_messages(record)
        b"".join(encode_stored(stored_message(m, queue_offset=i, position=1000 + i, store_ms=1,
                                              store_host=HOST)) for i, m in enumerate(messages))

    steps: dict[str, Callable[[], object]] = {"send": lambda: _broker_send(send), "batch": batch_step,
                                              "pull": pull_step}
    out = {}
    for name, step in steps.items():
        timer = timeit.Timer(step)
        loops, _ = timer.autorange()
        out[name] = min(timer.repeat(repeat, loops)) / loops * 1e6
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=64, help="messages per batch and per pulled record")
    parser.add_argument("--body-bytes", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    result = measure(args.count, args.body_bytes, args.repeat)
    print(f"send  (one message, V2 JSON header): {result['send']:.1f} us a frame")
    print(f"batch ({args.count} x {args.body_bytes} B): {result['batch']:.1f} us a frame, "
          f"{result['batch'] / args.count:.2f} us a message")
    print(f"pull  ({args.count} x {args.body_bytes} B, one record): {result['pull']:.1f} us a page, "
          f"{result['pull'] / args.count:.2f} us a message")


if __name__ == "__main__":
    main()
