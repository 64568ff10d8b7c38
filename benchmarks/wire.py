"""``python -m benchmarks.wire``: CPU per frame of the send and pull paths' wire work.

Each step is timed alone (timeit, the best of ``--repeat`` rounds) on one thread, with
no network: building and encoding a frame, or decoding one and its typed contents, as
the producer, the broker and the consumer do it::

    send  client: N messages -> a record -> SendBatchRequest -> bytes
          broker: bytes -> Frame -> SendBatchRequest -> the record's header
          broker: the record's messages checked (check_messages: the leader's one decode)
          broker: N SendRows -> SendBatchResponse -> bytes
          client: bytes -> Frame -> SendBatchResponse
    pull  client: PullRequest -> bytes;  broker: bytes -> Frame -> PullRequest
          broker: a PullRow of the record -> PullResponse -> bytes
          client: bytes -> Frame -> PullResponse -> the record's N MessageRecords

Figures are microseconds per frame (and per message where a frame carries N).
"""

from __future__ import annotations

import argparse
import os
import timeit
from collections.abc import Callable

from protocol.pull import PullRequest, PullResponse, PullRow
from protocol.record_batch import Entry, check_messages, encode_record, read_header
from protocol.remoting import decode_frame
from protocol.send import SendBatchRequest, SendBatchResponse, SendRow

__all__ = ["main", "measure"]


def _messages(count: int, body_bytes: int) -> list[Entry]:
    body = os.urandom(body_bytes)
    return [(os.urandom(16), 1_795_000_000_000, 0, "tagA", ("k1",), {}, 0, body) for _ in range(count)]


def _record(messages: list[Entry]) -> bytes:
    return encode_record("bench", 3, messages, producer_id="producer-1", base_sequence=0,
                         born_host="10.0.0.9:52000")


def steps(count: int, body_bytes: int) -> dict[str, Callable[[], object]]:
    """The timed steps, by name: each builds or reads one frame of ``count`` messages."""
    messages = _messages(count, body_bytes)
    records = [_record(messages)]
    checked = [(r, read_header(r)) for r in records]  # the leader has read the header already
    send = SendBatchRequest(records=tuple(records)).to_frame(7)
    send_bytes = send.encode()
    answer = SendBatchResponse(rows=tuple(SendRow(0, 3, i, "", 8192 + i) for i in range(count))).reply(send)
    answer_bytes = answer.encode()
    pull = PullRequest(topic="bench", queue_id=3, offset=40, max_msgs=count, suspend_ms=15_000).to_frame(8)
    pull_bytes = pull.encode()
    page = [PullRow(40, 8192, 1_795_000_000_123, r) for r in records]
    page_bytes = PullResponse(next_offset=40 + count, max_offset=50 + count, leaderless=False,
                              rows=page).reply(pull).encode()

    def pulled() -> object:
        return [row.messages() for row in PullResponse.from_frame(decode_frame(page_bytes)).rows or ()]

    return {
        "send: client builds the request": lambda: SendBatchRequest(
            records=(_record(messages),)).to_frame(7).encode(),
        "send: broker reads the request": lambda: [
            read_header(r) for r in SendBatchRequest.from_frame(decode_frame(send_bytes)).records],
        "send: broker checks the record's messages": lambda: [check_messages(r, h) for r, h in checked],
        "send: broker builds the answer": lambda: SendBatchResponse(
            rows=[SendRow(0, 3, i, "", 8192 + i) for i in range(count)]).reply(send).encode(),
        "send: client reads the answer": lambda: SendBatchResponse.from_frame(decode_frame(answer_bytes)),
        "pull: client builds the request": lambda: PullRequest(
            topic="bench", queue_id=3, offset=40, max_msgs=count, suspend_ms=15_000).to_frame(8).encode(),
        "pull: broker reads the request": lambda: PullRequest.from_frame(decode_frame(pull_bytes)),
        "pull: broker builds the answer": lambda: PullResponse(
            next_offset=40 + count, max_offset=50 + count, leaderless=False,
            rows=[PullRow(40, 8192, 1_795_000_000_123, r) for r in records]).reply(
                pull).encode(),
        "pull: client reads the answer and messages": pulled,
    }


def measure(work: Callable[[], object], repeat: int, budget_s: float = 0.2) -> float:
    """Best seconds per call of ``work`` over ``repeat`` rounds of about ``budget_s`` each."""
    timer = timeit.Timer(work)
    number, _ = timer.autorange()
    number = max(1, int(number * budget_s / 0.2))
    return min(timer.repeat(repeat, number)) / number


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wire", description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=64, help="messages per batch and per page (64)")
    parser.add_argument("--body-bytes", type=int, default=256, help="message body size (256)")
    parser.add_argument("--repeat", type=int, default=7, help="rounds; the best counts (7)")
    args = parser.parse_args(argv)
    print(f"{args.messages} messages of {args.body_bytes} B per frame; best of {args.repeat}")
    for name, work in steps(args.messages, args.body_bytes).items():
        seconds = measure(work, args.repeat)
        print(f"{name:45s} {seconds * 1e6:9.1f} us/frame {seconds * 1e6 / args.messages:7.2f} us/msg")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
