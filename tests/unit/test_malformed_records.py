"""Records whose header is sound but whose messages are not (guarantee 5: bad or hostile
input never corrupts or leaks data): the leader refuses them, naming what is wrong; one that
is in a store anyway (written by a broker before that check) is skipped and reported by
every consumer -- the pull and push consumers and Spark -- instead of stopping them."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import msgpack
import pytest

from broker.store.entry_batch import MessageTooLarge, pack_entries
from client import ConsumeStatus, PullConsumer, PushConsumer
from client.queues import MessageQueue
from protocol.pull import PullRequest, PullResponse
from protocol.record_batch import HEADER, MessageFormatError, check_messages, encode_record, read_header
from protocol.remoting import FrameError, RequestCode, ResponseCode
from protocol.send import SendBatchRequest, SendMessageRequest
from protocol.tags import tag_hash
from spark.options import parse_options
from spark.pages import decode_page
from spark.planning import QueueRange
from spark.range_reader import read_columns
from tests.support.broker_client import FrameClient
from tests.support.memory_broker import MemoryBroker, memory_broker
from tests.support.procs import wait_until

T0 = 1_700_000_000_000


def entries(first: int, count: int) -> list[Any]:
    return [(i.to_bytes(16, "big"), T0 + i, 0, f"t{i % 2}", (f"k{i}",), {"n": str(i)}, 0, b"m%d" % i)
            for i in range(first, first + count)]


def good(first: int = 0, count: int = 3) -> bytes:
    return encode_record("orders", 0, entries(first, count), born_host="h")


def rebuilt(record: bytes, *, section: bytes | None = None, key_table: bytes | None = None,
            codec: int = 0, raw: int | None = None, tag_hashes: bytes | None = None,
            base_born: int | None = None) -> bytes:
    """``record`` with parts replaced, its header's sizes made to agree (so that only what
    ``read_header`` does not look at is wrong)."""
    h = read_header(record)
    fields = list(HEADER.unpack_from(record))
    names = record[HEADER.size:h.tags_at]
    tags = record[h.tags_at:h.ids_at] if tag_hashes is None else tag_hashes
    ids = record[h.ids_at:h.keys_at]
    keys = record[h.keys_at:h.section_at] if key_table is None else key_table
    body = record[h.section_at:] if section is None else section
    fields[1] = (fields[1] & ~0x03) | codec
    if base_born is not None:
        fields[5] = base_born
    fields[10], fields[11], fields[12] = len(keys), len(body), len(body) if raw is None else raw
    return HEADER.pack(*fields) + names + tags + ids + keys + body


def rows(*row: list[Any]) -> bytes:
    return msgpack.packb(list(row), use_bin_type=True)


ROW = [0, 0, "t0", {}, 0, b"m"]
OTHER_TAG = tag_hash("other").to_bytes(8, "big", signed=True)
MALFORMED = {  # what is wrong -> (the record, what the refusal names)
    "not msgpack": (rebuilt(good(), section=b"\xc1\xc1\xc1"), "malformed message section"),
    "a body that is text": (rebuilt(good(), section=rows(ROW, ROW, [0, 0, "t0", {}, 0, "text"])),
                            "message 2: body"),
    "a row too short": (rebuilt(good(), section=rows(ROW, ROW[:4], ROW)), "message 1"),
    "fewer rows than messages": (rebuilt(good(), section=rows(ROW, ROW)), "2 messages, the header 3"),
    "a property that is a number": (rebuilt(good(), section=rows(ROW, [0, 0, "t1", {"a": 1}, 0, b"m"], ROW)),
                                    "message 1: properties"),
    "a section that does not decompress": (rebuilt(good(), section=b"\x28\xb5\x2f\xfd" + b"\x00" * 20,
                                                   codec=1, raw=100), "does not decompress"),
    "a key table of numbers": (rebuilt(good(), key_table=msgpack.packb([[1], [2], [3]])), "key table"),
    "tag hashes of other tags": (rebuilt(good(), tag_hashes=OTHER_TAG * 3), "message 0: its tag hash"),
    "a born time out of range": (rebuilt(good(), base_born=2**62), "born time"),
    "a born time far from the record's": (rebuilt(good(), section=rows(ROW, [2**50, *ROW[1:]], ROW)),
                                          "message 1: born delta"),
}


def test_a_sound_record_passes_the_check_and_each_malformed_one_is_named() -> None:
    for record in (good(), good(5, 1), encode_record("orders", 0, entries(0, 40), born_host="h",
                                                     compression="zstd")):
        assert check_messages(record).count == read_header(record).count
    for what, (record, named) in MALFORMED.items():
        read_header(record)  # the header alone is sound
        with pytest.raises(MessageFormatError, match=named):
            check_messages(record)
        assert what


def test_the_leader_refuses_a_record_whose_messages_do_not_decode(one_node_broker) -> None:  # type: ignore[no-untyped-def]
    async def scenario(b: MemoryBroker) -> None:
        await b.create_topic("orders", 1)
        before = b.rlog.committed_index
        for what, (record, named) in MALFORMED.items():
            with pytest.raises(FrameError) as refused:
                await b.call(b.sends.send_batch, SendBatchRequest(records=(good(), record)))
            assert refused.value.code == ResponseCode.INVALID_ARGUMENT, what
            assert named in str(refused.value) and "'orders' queue 0" in str(refused.value), what
        one = rebuilt(good(0, 1), section=rows([0, 0, "t0", {}, 0, 7]))
        with pytest.raises(FrameError) as refused:
            await b.call(b.sends.send, SendMessageRequest(message=one))
        assert refused.value.code == ResponseCode.INVALID_ARGUMENT and "message 0: body" in str(refused.value)
        # nothing was stored, not even the sound record sent beside a malformed one
        assert b.rlog.committed_index == before
        answer = await b.call(b.pulls.pull, PullRequest(topic="orders", queue_id=0, offset=0))
        assert answer.code == ResponseCode.PULL_NOT_FOUND, answer.remark

    in_memory(one_node_broker, scenario)


def in_memory(one_node_broker, scenario: Callable[[MemoryBroker], Awaitable[None]]) -> None:  # type: ignore[no-untyped-def]
    """``scenario`` on the processors of ``one_node_broker`` (no server, no socket)."""
    async def main() -> None:
        async with memory_broker(one_node_broker) as broker:
            await scenario(broker)

    asyncio.run(asyncio.wait_for(main(), 60))


def store_as_an_older_broker_did(one_node_broker, record: bytes) -> None:  # type: ignore[no-untyped-def]
    """``record`` proposed as its own entry straight to the log, past the leader's check."""
    rlog, machine, _ = one_node_broker
    (payload,) = pack_entries([record], int(time.time() * 1000))
    index = rlog.propose(payload).result(10).index
    wait_until(lambda: machine.applied_index() >= index, 10, what="the malformed record to be applied")


def warnings_about(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno == logging.WARNING]


def on_broker(address: str, scenario: Callable[[FrameClient], Awaitable[None]]) -> None:
    """``scenario`` with a FrameClient connected to the broker at ``address``."""
    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            c = await FrameClient.connect(session, address)
            try:
                await scenario(c)
            finally:
                await c.close()

    asyncio.run(main())


@pytest.fixture
def a_store_with_a_malformed_record(one_node_broker, broker: str) -> str:  # type: ignore[no-untyped-def]
    """Topic ``orders`` (one queue): offsets 0..2 and 5..7 sound records, 3..4 a record of two
    messages whose section does not decode."""
    async def first(c: FrameClient) -> None:
        assert (await c.call(RequestCode.CREATE_TOPIC, {"topic": "orders", "queues": 1})).code == 0
        assert (await c.call(RequestCode.SEND_BATCH, body=msgpack.packb([good(0, 3)]))).code == 0

    async def last(c: FrameClient) -> None:
        assert (await c.call(RequestCode.SEND_BATCH, body=msgpack.packb([good(5, 3)]))).code == 0

    on_broker(broker, first)
    store_as_an_older_broker_did(one_node_broker, rebuilt(good(3, 2), section=b"\xc1\xc1"))
    on_broker(broker, last)
    return broker


@pytest.mark.sockets
def test_the_pull_consumer_skips_and_reports_a_malformed_record(a_store_with_a_malformed_record: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "client.pull")
    c = PullConsumer(servers=[a_store_with_a_malformed_record], group="reader", read_from="any")
    try:
        q = MessageQueue("orders", "g1", 0)
        got, offset = [], 0
        while offset < 8:
            result = c.pull(q, offset, max_msgs=32)
            got += result.messages
            offset = result.next_offset
        assert [m.queue_offset for m in got] == [0, 1, 2, 5, 6, 7]
        assert [m.body for m in got] == [b"m0", b"m1", b"m2", b"m5", b"m6", b"m7"]
    finally:
        c.shutdown()
    (warning,) = warnings_about(caplog, "client.pull")
    assert "orders@g1#0" in warning and "offsets 3..4" in warning and "2 messages skipped" in warning


@pytest.mark.sockets
def test_the_push_consumer_skips_and_reports_a_malformed_record(a_store_with_a_malformed_record: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "client.pull")
    got: list[int] = []
    c = PushConsumer(servers=[a_store_with_a_malformed_record], group="billing", topic="orders",
                     from_where="first", read_from="any")
    c.register(lambda msgs, _ctx: (got.extend(m.queue_offset for m in msgs), ConsumeStatus.SUCCESS)[1])
    c.start()
    try:
        wait_until(lambda: len(got) >= 6, 20, what="the sound messages to be consumed")
    finally:
        c.shutdown()
    assert sorted(got) == [0, 1, 2, 5, 6, 7]
    assert any("offsets 3..4" in w for w in warnings_about(caplog, "client.pull"))


@pytest.mark.sockets
def test_spark_skips_and_reports_a_malformed_record(a_store_with_a_malformed_record: str,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "spark.raftmq")
    box: list[PullResponse] = []

    async def pull(c: FrameClient) -> None:
        r = await c.call(RequestCode.PULL_MESSAGE, {"topic": "orders", "queueId": 0, "offset": 0})
        box.append(PullResponse.from_frame(r))

    on_broker(a_store_with_a_malformed_record, pull)
    rng = QueueRange("orders", "g1", 0, 1, 8, (a_store_with_a_malformed_record,))
    cols = decode_page(box[0].rows or (), rng, None, 1)
    assert cols.queue_offset == [1, 2, 5, 6, 7] and cols.skipped == [(3, 5)]
    (warning,) = warnings_about(caplog, "spark.raftmq")
    assert "orders" in warning and "queue 0" in warning and "offsets 3..4" in warning
    # the partition reader: the range is complete with the malformed record's messages skipped
    opts = parse_options({"servers": a_store_with_a_malformed_record, "topic": "orders",
                          "readFrom": "leader"})
    got = [o for c in read_columns(opts, rng) for o in c.queue_offset]
    assert got == [1, 2, 5, 6, 7]


def test_a_filtered_pull_skips_and_reports_a_malformed_record_on_the_broker(
        one_node_broker, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    """An SQL92 filter reads properties on the broker: the record it cannot read is left out
    of the page and the broker says so (the consumer never sees it to report it)."""
    caplog.set_level(logging.WARNING, "broker.pull")
    got: list[int] = []

    async def scenario(b: MemoryBroker) -> None:
        await b.create_topic("orders", 1)
        await b.call(b.sends.send_batch, SendBatchRequest(records=(good(0, 3),)))
        await asyncio.to_thread(store_as_an_older_broker_did, one_node_broker,
                                rebuilt(good(3, 2), section=b"\xc1\xc1"))
        await b.call(b.sends.send_batch, SendBatchRequest(records=(good(5, 3),)))
        answer = await b.call(b.pulls.pull, PullRequest(topic="orders", queue_id=0, offset=0, sql="n <> 'x'"))
        for row in PullResponse.from_frame(answer).rows or ():
            got.extend(row.offset + i for i in row.selected or ())

    in_memory(one_node_broker, scenario)
    assert got == [0, 1, 2, 5, 6, 7]
    (warning,) = warnings_about(caplog, "broker.pull")
    assert "topic 'orders' queue 0" in warning and "offsets 3..4" in warning


def test_a_record_that_inflates_past_the_limit_is_refused_before_it_is_decompressed(
        one_node_broker) -> None:  # type: ignore[no-untyped-def]
    """The leader decompresses what it checks: a small record whose section claims to inflate
    past max_message_bytes (4 MiB) is refused from its header (a decompression bomb costs it
    nothing), as a record that large would be."""
    bomb = encode_record("orders", 0, [(bytes(16), T0, 0, None, (), {}, 0, bytes(5 << 20))],
                         compression="zstd")
    assert len(bomb) < 4096 and read_header(bomb).raw_length > 5 << 20

    async def scenario(b: MemoryBroker) -> None:
        await b.create_topic("orders", 1)
        with pytest.raises(MessageTooLarge, match="decompressed"):
            await b.call(b.sends.send_batch, SendBatchRequest(records=(bomb,)))

    in_memory(one_node_broker, scenario)
