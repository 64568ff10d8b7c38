"""``raftmq bench consume|receive``: the read side of the client benchmark, and its progress line.

``consume`` drains every queue of the topic with pull fetches from offset 0 to the end
seen at the start; ``receive`` drains it with ``--consumers`` SimpleConsumers of a new
group (receive + ack). Both first ``load`` ``--messages`` messages when asked. ``Progress``
is the once-a-second progress line the produce modes (``raftmq.bench``) print too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

from client.aio import AsyncProducer, AsyncSimpleConsumer
from client.aio.core import ClientCore
from client.aio.pull_consumer import fetch, queue_offsets
from client.aio.routes import PERM_READ
from client.message import Message

__all__ = ["Progress", "consume", "load", "receive"]


class Progress:
    """Counts a run's messages, bytes and errors; ``run`` prints a line a second (unless quiet)."""

    def __init__(self, label: str, quiet: bool) -> None:
        self.label, self.quiet = label, quiet
        self.count = 0
        self.bytes = 0
        self.errors = 0
        self.started = time.monotonic()
        self._last = (self.started, 0)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            rate = (self.count - self._last[1]) / (now - self._last[0])
            self._last = (now, self.count)
            if not self.quiet:
                print(f"  {self.label}: {now - self.started:5.1f} s  {self.count:>10,} msgs  "
                      f"{rate:>10,.0f} msgs/s  errors {self.errors}", file=sys.stderr, flush=True)


async def consume(args: argparse.Namespace, where: dict[str, Any]) -> dict[str, Any]:
    await _load_first(args, where)
    core = ClientCore(where.get("namesrv"), where.get("servers"), tls=where.get("tls"),
                      credentials=where.get("credentials"))
    progress = Progress("consume", args.json)
    try:
        route = await core.routes.route(args.topic)
        queues = route.queues(PERM_READ)
        ends = {q: (await queue_offsets(core, q))[1] for q in queues}
        total = sum(ends.values())
        ticker = asyncio.create_task(progress.run())
        started = time.monotonic()

        async def drain(q: Any) -> None:
            offset = 0
            while offset < ends[q]:
                r = await fetch(core, q, offset, max_msgs=256, read_from=args.read_from)
                offset = r.next_offset
                progress.count += len(r.messages)
                progress.bytes += sum(len(m.body) for m in r.messages)

        await asyncio.gather(*(drain(q) for q in queues))
        elapsed = time.monotonic() - started
        ticker.cancel()
    finally:
        await core.close()
    return {"mode": "consume", "read_from": args.read_from, "messages": progress.count, "expected": total,
            "seconds": round(elapsed, 2), "msgs_per_s": round(progress.count / elapsed),
            "mb_per_s": round(progress.bytes / elapsed / 1e6, 2)}


async def receive(args: argparse.Namespace, where: dict[str, Any]) -> dict[str, Any]:
    """``--consumers`` SimpleConsumers of one new group drain what was loaded: receive 32 at a
    time, ack each (the acks of a batch concurrently). Counts messages acked."""
    await _load_first(args, where)
    group = f"bench-simple-{os.getpid()}-{int(time.time())}"
    consumers = [AsyncSimpleConsumer(group=group, topic=args.topic, **where) for _ in range(args.consumers)]
    progress = Progress("receive", args.json)
    idle_s = 0.0
    try:
        ticker = asyncio.create_task(progress.run())
        started = time.monotonic()

        async def work(c: AsyncSimpleConsumer) -> None:
            nonlocal idle_s
            while progress.count < args.messages:
                batch = await c.receive(max_messages=32, invisible_duration_s=60, wait_s=2)
                if not batch:
                    idle_s += 2
                    if idle_s > 10 * args.consumers:
                        return  # nothing more arrives: what was loaded is drained (or lost: reported)
                    continue
                await asyncio.gather(*(c.ack(m) for m in batch))
                progress.count += len(batch)
                progress.bytes += sum(len(m.body) for m in batch)

        await asyncio.gather(*(work(c) for c in consumers))
        elapsed = time.monotonic() - started
        ticker.cancel()
    finally:
        for c in consumers:
            await c.close()
    return {"mode": "receive", "consumers": args.consumers, "messages": progress.count,
            "expected": args.messages, "seconds": round(elapsed, 2),
            "msgs_per_s": round(progress.count / elapsed),
            "mb_per_s": round(progress.bytes / elapsed / 1e6, 2)}


async def _load_first(args: argparse.Namespace, where: dict[str, Any]) -> None:
    """Load ``--messages`` messages of ``--size`` bytes before a read mode, when asked."""
    if args.messages:
        print(f"  loading {args.messages:,} messages of {args.size} B ...", file=sys.stderr, flush=True)
        await load(args, where, args.messages)


async def load(args: argparse.Namespace, where: dict[str, Any], count: int) -> None:
    body = b"x" * args.size
    async with AsyncProducer(**where, group="bench-loader", send_timeout=30) as p:
        per_worker = count // 16

        async def worker(w: int) -> None:
            left = per_worker + (count % 16 if w == 0 else 0)
            while left > 0:
                n = min(256, left)
                await p.send_batch([Message(args.topic, body)] * n, shard_key=f"load-{w}")
                left -= n

        await asyncio.gather(*(worker(w) for w in range(16)))
