"""Issue 25, row 3 (second pass, G2): compressed records are decompressed off the event
loop. The send processor's reading of a request's records and an SQL92-filtered pull's
reading of properties run on ``broker.store.inflation.INFLATING``'s threads (named
``inflate-*``): a patched decompressor records the thread of every call, and a test fails
if either moves onto the loop. A broker on the memory log, no sockets."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

import msgpack
import pytest

from broker.remoting.server import AppliedSignal, BrokerServer
from broker.state.machine import BrokerStateMachine
from dledger.applier import Applier
from dledger.log import Log
from protocol import record_section
from protocol.pull import PullRequest
from protocol.record_batch import encode_record
from protocol.remoting import ResponseCode
from protocol.send import SendBatchRequest
from protocol.topic import CreateTopicRequest

Parts = tuple[Log, BrokerStateMachine, Applier]


def _record(i: int, region: str) -> bytes:
    return encode_record("orders", 0, [(i.to_bytes(16, "big"), 1_700_000_000_000, 0, None, None,
                                        {"region": region}, 0, b"order " * 200)], compression="zstd")


def _run(parts: Parts, scenario: Callable[[BrokerServer], Awaitable[None]]) -> None:
    rlog, machine, applier = parts

    async def main() -> None:
        server = BrokerServer(rlog, machine, applier, AppliedSignal(asyncio.get_running_loop()),
                              lambda _n: None)
        answer = await server.handle(CreateTopicRequest(topic="orders", queues=1).to_frame(1))
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        await scenario(server)

    asyncio.run(asyncio.wait_for(main(), 60))


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread of every decompression from now on."""
    names: list[str] = []
    decompress = record_section._decompress

    def recorded(codec: int, data: bytes, raw_length: int) -> bytes:
        names.append(threading.current_thread().name)
        return decompress(codec, data, raw_length)

    monkeypatch.setattr(record_section, "_decompress", recorded)
    return names


def test_the_send_processor_reads_compressed_records_on_an_inflating_thread(
        one_node_broker: Parts, threads: list[str]) -> None:
    async def scenario(server: BrokerServer) -> None:
        records = (_record(1, "eu"), _record(2, "us"))
        answer = await server.handle(SendBatchRequest(records=records).to_frame(2))
        assert answer.code == ResponseCode.SUCCESS, answer.remark

    _run(one_node_broker, scenario)
    assert len(threads) >= 2, "the send decompressed nothing: the test no longer sees the check"
    assert all(name.startswith("inflate") for name in threads), set(threads)


def test_an_sql_filtered_pull_reads_properties_on_an_inflating_thread(
        one_node_broker: Parts, threads: list[str]) -> None:
    async def scenario(server: BrokerServer) -> None:
        sent = await server.handle(SendBatchRequest(records=tuple(
            _record(i, "eu" if i % 2 else "us") for i in range(6))).to_frame(2))
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        threads.clear()  # the send's own reading: the test above
        answer = await server.handle(PullRequest(topic="orders", queue_id=0, offset=0, max_msgs=32,
                                                 sql="region = 'eu'").to_frame(3))
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        rows = msgpack.unpackb(answer.body)
        assert [row[0] for row in rows] == [1, 3, 5]  # the filter read the properties

    _run(one_node_broker, scenario)
    assert len(threads) >= 6, "the pull decompressed nothing: the test no longer sees the filter"
    assert all(name.startswith("inflate") for name in threads), set(threads)
