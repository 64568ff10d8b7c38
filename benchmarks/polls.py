"""``python -m benchmarks.polls``: send latency on a leader holding many parked long polls.

A local 3-node broker group (processes, under a temporary directory); on the leader, one
WebSocket parks ``--parked`` PULLs (30 s long polls, re-parked when they return) on the
queues of a topic nobody sends to, while another sends ``--sends`` messages one at a time
to another topic. Prints the send latency (p50, p99, max) with and without the parked
pulls, and how the pulls were answered (parked, or SYSTEM_BUSY over a cap)::

    python -m benchmarks.polls --parked 3000 --sends 200
    python -m benchmarks.polls --parked 3000 --broker max_parked_pulls_per_connection=3000

Only the broker's wire protocol is used (no client library), so the same script measures a
broker of any version from the same frames.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from protocol.message_format import Message, encode_message
from protocol.pull import PullRequest
from protocol.remoting import Frame, ResponseCode, decode_frame
from protocol.send import SendMessageRequest
from protocol.topic import CreateTopicRequest
from protocol.wire import Request
from raftmq.local_group import LocalGroup

__all__ = ["main"]

IDLE_QUEUES = 8


class _Link:
    """One WebSocket with responses matched to requests by opaque."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[Frame]] = {}
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            frame = decode_frame(msg.data)
            fut = self.waiting.pop(frame.opaque, None)
            if fut is not None and not fut.done():
                fut.set_result(frame)

    async def call(self, request: Request, timeout: float = 60.0) -> Frame:
        opaque = next(self.ids)
        fut = self.waiting[opaque] = asyncio.get_running_loop().create_future()
        await self.ws.send_bytes(request.to_frame(opaque).encode())
        return await asyncio.wait_for(fut, timeout)


async def _sends(link: _Link, n: int) -> list[float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        r = await link.call(SendMessageRequest(message=encode_message(Message("busy", b"m%d" % i, 0))))
        if r.code != ResponseCode.SUCCESS:
            raise RuntimeError(f"send failed: {r.code} {r.remark}")
        out.append(time.perf_counter() - started)
    return out


async def _park(link: _Link, queue_id: int, answers: dict[int, int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        r = await link.call(PullRequest(topic="idle", queue_id=queue_id, offset=0, suspend_ms=30_000),
                            timeout=90)
        answers[r.code] = answers.get(r.code, 0) + 1
        if r.code != ResponseCode.PULL_NOT_FOUND:
            return  # refused over a cap: it does not come back


def _summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (f"p50 {statistics.median(ordered) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
            f"max {ordered[-1] * 1000:.1f} ms")


async def _measure(address: str, parked: int, sends: int) -> None:
    async with aiohttp.ClientSession() as http:
        admin = _Link(await http.ws_connect(f"http://{address}/ws", max_msg_size=16 << 20))
        for topic, queues in (("idle", IDLE_QUEUES), ("busy", 1)):
            r = await admin.call(CreateTopicRequest(topic=topic, queues=queues))
            if r.code != ResponseCode.SUCCESS:
                raise RuntimeError(f"create {topic}: {r.code} {r.remark}")
        await _sends(admin, 20)  # warm up
        print(f"sends alone:                       {_summary(await _sends(admin, sends))}")
        poller = _Link(await http.ws_connect(f"http://{address}/ws", max_msg_size=16 << 20))
        answers: dict[int, int] = {}
        stop = asyncio.Event()
        polls = [asyncio.create_task(_park(poller, i % IDLE_QUEUES, answers, stop)) for i in range(parked)]
        await asyncio.sleep(2.0)  # every pull is parked or refused by now
        refused = sum(n for code, n in answers.items() if code != ResponseCode.PULL_NOT_FOUND)
        print(f"sends with {parked} pulls asked to park: {_summary(await _sends(admin, sends))} "
              f"({parked - refused} parked, {refused} answered SYSTEM_BUSY at once)")
        stop.set()
        for task in polls:
            task.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.polls", description=__doc__.split("\n")[0])
    parser.add_argument("--parked", type=int, default=3000)
    parser.add_argument("--sends", type=int, default=200)
    parser.add_argument("--broker", action="append", default=[], metavar="KEY=INT",
                        help="a [broker] setting of the nodes (repeatable)")
    args = parser.parse_args(argv)
    options = {k: int(v) for k, v in (o.split("=", 1) for o in args.broker)}
    with tempfile.TemporaryDirectory(prefix="bench-polls-") as base:
        group = LocalGroup(Path(base) / "g", 3, module="broker",
                           broker={"index_slots": 4096, "index_entries": 65536, **options})
        try:
            group.start()
            leader = group.wait_leader(timeout=30)
            asyncio.run(_measure(group.nodes[leader].http, args.parked, args.sends))
        finally:
            group.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
