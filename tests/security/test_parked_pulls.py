"""Parked long polls (issue 15, row 7): 3,000 PULLs parked on one connection neither wake on
every applied entry nor all park.

Before: every applied entry woke every parked pull (each re-read its queue), so sends slowed
with the number parked (measured on a 3-node group: send p99 22 ms -> 2.1 s). Now a pull
parked on queue Q wakes when Q grows, and at most ``MAX_PARKED_PER_CONNECTION`` park on one
connection: the others are answered SYSTEM_BUSY at once.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from broker.processors.long_polls import MAX_PARKED_PER_CONNECTION
from protocol.message_format import Message, encode_message
from protocol.remoting import RequestCode, ResponseCode
from tests.support.broker_client import FrameClient
from tests.support.inprocess_broker import serving_broker

PARKED = 3000
SENDS = 40


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def send_latencies(c: FrameClient, topic: str, n: int) -> list[float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        r = await c.call(RequestCode.SEND_MESSAGE, body=encode_message(Message(topic, b"m%d" % i, 0)))
        assert r.code == ResponseCode.SUCCESS, r.remark
        out.append(time.perf_counter() - started)
    return out


def test_parked_pulls_wake_by_queue_and_are_capped_per_connection(tmp_path: Path) -> None:
    async def main() -> None:
        async with serving_broker(tmp_path) as (server, address), aiohttp.ClientSession() as http:
            admin = await FrameClient.connect(http, address)
            for topic, queues in (("idle", 8), ("busy", 1)):
                r = await admin.call(RequestCode.CREATE_TOPIC, {"topic": topic, "queues": queues})
                assert r.code == ResponseCode.SUCCESS, r.remark
            alone = await send_latencies(admin, "busy", SENDS)

            poller = await FrameClient.connect(http, address)
            polls = [asyncio.create_task(poller.call(
                RequestCode.PULL_MESSAGE, {"topic": "idle", "queueId": i % 8, "offset": 0,
                                           "suspendMs": 20_000}, timeout=30))
                     for i in range(PARKED)]
            busy_deadline = time.monotonic() + 5
            while sum(p.done() for p in polls) < PARKED - MAX_PARKED_PER_CONNECTION:
                assert time.monotonic() < busy_deadline, (
                    f"{sum(p.done() for p in polls)} of {PARKED} pulls answered in 5 s: the pulls over "
                    f"the cap of {MAX_PARKED_PER_CONNECTION} per connection should be answered at once")
                await asyncio.sleep(0.05)
            refused = [p.result() for p in polls if p.done()]
            assert {r.code for r in refused} == {ResponseCode.SYSTEM_BUSY}, {r.code for r in refused}
            assert "parked on this connection" in refused[0].remark

            reads = 0
            read_queue = server.machine.queue

            def counting_queue(topic: str, queue_id: int):  # type: ignore[no-untyped-def]
                nonlocal reads
                reads += 1
                return read_queue(topic, queue_id)

            server.machine.queue = counting_queue  # type: ignore[method-assign]
            parked = await send_latencies(admin, "busy", SENDS)
            print(f"\nsend p99 alone {p99(alone) * 1000:.1f} ms, with {PARKED} pulls asked to park on one "
                  f"connection {p99(parked) * 1000:.1f} ms; queue reads during {SENDS} sends: {reads}")
            assert reads < 10 * SENDS, f"{reads} queue reads for {SENDS} sends: parked pulls woke on them"

            on_three = [p for i, p in enumerate(polls) if i % 8 == 3 and not p.done()]
            assert on_three
            r = await admin.call(RequestCode.SEND_MESSAGE, body=encode_message(Message("idle", b"x", 3)))
            assert r.code == ResponseCode.SUCCESS
            woken_deadline = time.monotonic() + 5
            while not all(p.done() for p in on_three):
                assert time.monotonic() < woken_deadline, "pulls parked on idle/3 did not wake on its message"
                await asyncio.sleep(0.02)
            assert {p.result().code for p in on_three} == {ResponseCode.SUCCESS}
            others = [p for i, p in enumerate(polls) if i % 8 != 3]
            assert not any(p.done() and p.result().code == ResponseCode.SUCCESS for p in others), (
                "a pull parked on another queue returned a message")
            for p in polls:
                p.cancel()
            await poller.close()
            await admin.close()

    asyncio.run(main())
