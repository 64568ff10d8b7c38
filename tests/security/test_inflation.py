"""Issue 25, row 3: compressed records cannot make the broker inflate without bound, nor
stall its event loop while they inflate.

Before: a SEND_BATCH of thousands of tiny zstd records, each inflating to
``max_message_bytes``, was decompressed and checked synchronously on the leader's event
loop (~7 s per 4 MiB frame, every client of the replica waiting); an SQL92-filtered pull
inflated up to 1,024 records. Now a request's records may inflate to
``MAX_INFLATED_PER_REQUEST`` in all (refused from their headers, before anything is
decompressed), a filtered pull stops once it inflated ``MAX_INFLATED_PER_PULL``, and both
decompress on a worker thread. A one-replica broker process, stopped by PID.
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
from collections.abc import Iterator

import pytest

from broker.store.inflation import MAX_INFLATED_PER_PULL, MAX_INFLATED_PER_REQUEST
from protocol.pull import PullRequest, PullResponse
from protocol.record_batch import encode_record
from protocol.remoting import ResponseCode
from protocol.send import SendBatchRequest
from raftmq.local_group import LocalGroup
from tests.support.broker_client import FrameClient, client_session
from tests.support.client_calls import create_topic_at
from tests.support.procs import led

pytestmark = [pytest.mark.cluster]

RAW = (4 << 20) - 4096  # a message section just under the 4 MiB limit


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    group = LocalGroup(tmp_path_factory.mktemp("inflate") / "g", 1, module="broker")
    with led(group, LocalGroup.wait_leader):
        address = group.nodes["n1"].http
        create_topic_at([address], "bombs", 1)
        yield address


def bomb(body_bytes: int = RAW - 256, props: dict[str, str] | None = None) -> bytes:
    """A record of one message of zeros: a few hundred bytes, inflating to ~4 MiB."""
    return encode_record("bombs", 0, [(os.urandom(16), int(time.time() * 1000), 0, None, None, props or {}, 0,
                                       b"\0" * body_bytes)], compression="zstd")


def healthz_ms(address: str) -> float:
    started = time.monotonic()
    with urllib.request.urlopen(f"http://{address}/healthz", timeout=60) as resp:
        resp.read()
    return (time.monotonic() - started) * 1000


def undecompressable(record: bytes) -> bytes:
    """``record`` with its compressed message section replaced by bytes no codec decodes;
    the header (its raw length among them) unchanged: only a broker that decompresses it
    can tell."""
    section = int.from_bytes(record[36:40], "big")  # the section's length as stored
    return record[:-section] + b"\xff" * section


def _send(address: str, records: tuple[bytes, ...]) -> tuple[int, str]:
    async def send() -> tuple[int, str]:
        async with client_session() as session:
            client = await FrameClient.connect(session, address)
            try:
                answer = await client.raw(SendBatchRequest(records=records).to_frame(1).encode(), timeout=120)
                return answer.code, answer.remark or ""
            finally:
                await client.close()
    return asyncio.run(send())


def test_a_batch_of_bombs_is_refused_from_its_headers(broker: str) -> None:
    """The mechanism, not a time: bombs whose sections no codec decodes are refused as too
    large (naming the request's bound), which only a check of the headers can say -- one
    such record under the bound is refused as malformed once it is decompressed."""
    record = undecompressable(bomb())
    assert len(record) < 2048
    count = 2000  # ~8 GiB inflated in a frame of a few MiB at most
    code, remark = _send(broker, (record,))
    assert code != ResponseCode.SUCCESS and f"{MAX_INFLATED_PER_REQUEST}" not in remark, (code, remark)

    async def send() -> tuple[int, str, float]:
        async with client_session() as session:
            client = await FrameClient.connect(session, broker)
            try:
                loop = asyncio.get_running_loop()
                probe = loop.run_in_executor(None, healthz_ms, broker)
                await asyncio.sleep(0.05)
                started = time.monotonic()
                answer = await client.raw(SendBatchRequest(records=(record,) * count).to_frame(1).encode(),
                                          timeout=120)
                took = time.monotonic() - started
                await probe
                return answer.code, answer.remark or "", took
            finally:
                await client.close()

    code, remark, took = asyncio.run(send())
    assert code == ResponseCode.MESSAGE_TOO_LARGE, (code, remark)
    assert f"{MAX_INFLATED_PER_REQUEST}" in remark, remark
    print(f"refused in {took:.3f} s; /healthz after it {healthz_ms(broker):.0f} ms (measured, not asserted)")


def test_checking_a_large_legal_batch_does_not_stall_the_loop(broker: str) -> None:
    records = tuple(bomb() for _ in range(MAX_INFLATED_PER_REQUEST // RAW))

    async def send() -> tuple[int, float]:
        async with client_session() as session:
            client = await FrameClient.connect(session, broker)
            try:
                loop = asyncio.get_running_loop()
                batch = SendBatchRequest(records=records).to_frame(1).encode()
                sending = asyncio.ensure_future(client.raw(batch, timeout=120))
                await asyncio.sleep(0.01)
                worst = max([await loop.run_in_executor(None, healthz_ms, broker) for _ in range(5)])
                answer = await sending
                return answer.code, worst
            finally:
                await client.close()

    code, worst = asyncio.run(send())
    assert code == ResponseCode.SUCCESS
    assert worst < 500, f"/healthz waited {worst:.0f} ms while the batch was checked"


def test_an_sql_pull_inflates_a_bounded_amount(broker: str) -> None:
    async def run() -> PullResponse:
        async with client_session() as session:
            client = await FrameClient.connect(session, broker)
            try:
                for _ in range(3):  # 3 x 15 records of ~4 MiB inflated
                    frame = SendBatchRequest(records=tuple(bomb(props={"k": "v"}) for _ in range(15))
                                             ).to_frame(1)
                    assert (await client.raw(frame.encode(), timeout=120)).code == ResponseCode.SUCCESS
                pull = PullRequest(topic="bombs", queue_id=0, offset=0, max_msgs=32, suspend_ms=0,
                                   sql="k = 'nothing'")
                answer = await client.raw(pull.to_frame(9).encode(), timeout=120)
                return PullResponse.from_frame(answer)
            finally:
                await client.close()

    got = asyncio.run(run())
    assert not got.rows
    assert got.next_offset <= MAX_INFLATED_PER_PULL // RAW + 1, got.next_offset
