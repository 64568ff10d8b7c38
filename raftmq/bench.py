"""``raftmq bench produce|consume|receive``: client throughput and latency against a cluster.

    raftmq bench produce --local --size 256 --batch 64 --inflight 32 --duration 20
    raftmq bench produce --local --size 256 --rate 1000 --duration 20      # latency at a fixed rate
    raftmq bench consume --local --messages 200000 --size 256              # loads, then reads
    raftmq bench receive --local --messages 50000 --consumers 8            # SimpleConsumers: receive + ack
    raftmq bench produce --local --groups 2 --size 256 --batch 64           # a topic over two groups
    raftmq bench produce --local --api blocking --batch 100 --inflight 4    # client.Producer.send_batch
    raftmq bench produce --local --api blocking --inflight 64               # send from 64 threads
    raftmq bench produce --local --api blocking --send-async --inflight 1000  # send_async, 1,000 in flight

``--local`` starts a name server and a 3-node group in a temporary directory (flush
policy sync; ``--tls``: TLS on every port, with a local CA; ``--acl``: users and ACLs on,
the client a super user authenticating by SCRAM) and stops them afterwards;
otherwise give --namesrv/--servers/--dir (and ``--ca-file`` & co. for a TLS cluster).
A progress line is printed every second; the result is printed as a table, or as
JSON with ``--json``. Latency is per send call (a batch counts once).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from client.aio import AsyncAdmin, AsyncProducer
from client.cli_cluster import add_tls_arguments, client_kwargs, cluster_tls
from client.errors import ClientError
from client.message import Message
from raftmq.bench_read import Progress, consume, receive

__all__ = ["main"]


def _percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def _body(size: int) -> bytes:
    return os.urandom(size // 2).hex().encode()[:size].ljust(size, b"x")


def _producer_options(args: argparse.Namespace) -> dict[str, Any]:
    """The accumulator's settings given on the command line (else the producer's defaults)."""
    given = {"linger_ms": args.linger_ms, "max_in_flight": args.max_in_flight,
             "batch_bytes": args.batch_bytes, "compression": args.compression}
    return {k: v for k, v in given.items() if v is not None}


def _produce_result(args: argparse.Namespace, progress: Progress, elapsed: float,
                    latencies: list[float]) -> dict[str, Any]:
    latencies.sort()
    return {"mode": "produce", "api": args.api, "send_async": args.send_async, "size": args.size,
            "batch": args.batch, "inflight": args.inflight, "producer": _producer_options(args),
            "rate": args.rate, "shard_keys": args.shard_keys, "seconds": round(elapsed, 2),
            "messages": progress.count, "errors": progress.errors,
            "msgs_per_s": round(progress.count / elapsed),
            "mb_per_s": round(progress.bytes / elapsed / 1e6, 2),
            "latency_ms": {f"p{p}": round(_percentile(latencies, p) * 1000, 2) for p in (50, 99, 99.9)}}


def _produce_blocking(args: argparse.Namespace, where: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """The blocking client (``client.Producer``): ``--inflight`` threads each calling
    ``send_batch`` (``--batch`` > 1) or ``send``; with ``--send-async``, one thread keeping
    ``--inflight`` single ``send_async`` calls in flight."""
    import threading

    from client.sync import Producer

    body = _body(args.size)
    latencies: list[float] = []
    keys = [f"shard-{i}" for i in range(args.shard_keys)] if args.shard_keys else [None]
    lock = threading.Lock()
    p = Producer(**where, group="bench-producer", send_timeout=30, **_producer_options(args)).start()
    try:
        p.send(Message(args.topic, b"warm-up"))
        stop_at = time.monotonic() + args.duration
        started = time.monotonic()

        def counted(n: int, t0: float) -> None:
            latencies.append(time.monotonic() - t0)
            with lock:
                progress.count += n
                progress.bytes += n * args.size

        def worker(w: int) -> None:
            i = w
            while time.monotonic() < stop_at:
                key = keys[i % len(keys)]
                i += args.inflight
                t0 = time.monotonic()
                try:
                    if args.batch > 1:
                        p.send_batch([Message(args.topic, body)] * args.batch, shard_key=key)
                    else:
                        p.send(Message(args.topic, body), shard_key=key)
                except ClientError:
                    progress.errors += 1
                    continue
                counted(args.batch, t0)

        if args.send_async:
            # up to --inflight sends in flight, topped up whenever a tenth of them are answered
            # (a semaphore woken per answer would cost more than the send it measures)
            in_flight = [0]
            room = threading.Event()
            low = args.inflight - max(1, args.inflight // 10)

            def sent(t0: float, result: object, error: BaseException | None) -> None:
                with lock:
                    in_flight[0] -= 1
                    left = in_flight[0]
                if left <= low:
                    room.set()
                if error is not None:
                    progress.errors += 1
                else:
                    latencies.append(time.monotonic() - t0)
                    progress.count += 1
                    progress.bytes += args.size

            n = 0
            while time.monotonic() < stop_at:
                room.clear()
                top_up = args.inflight - in_flight[0]
                with lock:
                    in_flight[0] += top_up
                for _ in range(top_up):  # each send timed from its own call
                    t0 = time.monotonic()
                    p.send_async(Message(args.topic, body),
                                 lambda r, e, t0=t0: sent(t0, r, e), shard_key=keys[n % len(keys)])
                    n += 1
                room.wait(1.0)
            deadline = time.monotonic() + 30
            while in_flight[0] and time.monotonic() < deadline:  # every send answered
                time.sleep(0.01)
        else:
            threads = [threading.Thread(target=worker, args=(w,)) for w in range(args.inflight)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        elapsed = time.monotonic() - started
    finally:
        p.shutdown()
    return _produce_result(args, progress, elapsed, latencies)


async def _produce(args: argparse.Namespace, where: dict[str, Any]) -> dict[str, Any]:
    if args.api == "blocking":
        progress = Progress("produce", args.json)
        ticker = asyncio.create_task(progress.run())
        try:
            return await asyncio.to_thread(_produce_blocking, args, where, progress)
        finally:
            ticker.cancel()
    body = _body(args.size)
    latencies: list[float] = []
    progress = Progress("produce", args.json)
    keys = [f"shard-{i}" for i in range(args.shard_keys)] if args.shard_keys else [None]
    stop_at = time.monotonic() + args.duration
    options = _producer_options(args)
    async with AsyncProducer(**where, group="bench-producer", send_timeout=30, **options) as p:
        await p.send(Message(args.topic, b"warm-up"))

        async def one(worker: int) -> None:
            i = worker
            while time.monotonic() < stop_at:
                key = keys[i % len(keys)]
                i += args.inflight
                batch = [Message(args.topic, body)] * args.batch
                t0 = time.monotonic()
                try:
                    if args.batch == 1:  # a single send: through the accumulator
                        await p.send(batch[0], shard_key=key)
                    else:
                        await p.send_batch(batch, shard_key=key)
                except ClientError:
                    progress.errors += 1
                    continue
                latencies.append(time.monotonic() - t0)
                progress.count += len(batch)
                progress.bytes += len(batch) * args.size

        async def paced() -> None:
            interval = 1.0 / args.rate
            next_at = time.monotonic()
            pending: set[asyncio.Task[None]] = set()

            async def send_one(n: int) -> None:
                t0 = time.monotonic()
                try:
                    await p.send(Message(args.topic, body), shard_key=keys[n % len(keys)])
                except ClientError:
                    progress.errors += 1
                    return
                latencies.append(time.monotonic() - t0)
                progress.count += 1
                progress.bytes += args.size

            n = 0
            while time.monotonic() < stop_at:
                if len(pending) < args.inflight:
                    t = asyncio.create_task(send_one(n))
                    pending.add(t)
                    t.add_done_callback(pending.discard)
                    n += 1
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if pending:
                await asyncio.wait(pending, timeout=30)

        ticker = asyncio.create_task(progress.run())
        started = time.monotonic()
        if args.rate:
            await paced()
        else:
            await asyncio.gather(*(one(w) for w in range(args.inflight)))
        elapsed = time.monotonic() - started
        ticker.cancel()
    return _produce_result(args, progress, elapsed, latencies)


@contextlib.contextmanager
def _local_cluster(groups: int = 1, tls: bool = False, acl: bool = False) -> Iterator[dict[str, Any]]:
    from raftmq import cluster_cmd
    from raftmq.local_acl import local_credentials

    with tempfile.TemporaryDirectory(prefix="raftmq-bench-") as d:
        flags = [*(["--tls"] if tls else []), *(["--acl"] if acl else [])]
        if cluster_cmd.main(["up", "--dir", d, "--namesrv-port", "0", "--groups", str(groups), *flags]) != 0:
            raise SystemExit("error: the local cluster did not start")
        try:
            state = json.loads((Path(d) / "cluster.json").read_text())
            credentials = local_credentials(Path(d))
            who = {} if credentials is None else {"credentials": credentials}
            yield {"namesrv": [cluster_cmd.namesrv_address(d)], "tls": cluster_tls(state) or False, **who}
        finally:
            cluster_cmd.main(["down", "--dir", d])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raftmq bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    configure(parser)
    return run_command(parser.parse_args(argv))


def configure(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``raftmq bench``."""
    parser.add_argument("mode", choices=["produce", "consume", "receive"])
    parser.add_argument("--topic", default="bench", help="topic (created with 8 queues if missing)")
    parser.add_argument("--size", type=int, default=256, help="message body bytes (default 256)")
    parser.add_argument("--batch", type=int, default=1, help="messages per send call (default 1)")
    parser.add_argument("--inflight", type=int, default=32, help="concurrent send calls (default 32)")
    parser.add_argument("--api", choices=["asyncio", "blocking"], default="asyncio",
                        help="the client API: AsyncProducer (default) or the blocking client.Producer "
                             "(--inflight threads)")
    parser.add_argument("--send-async", action="store_true",
                        help="--api blocking: single send_async calls, --inflight of them in flight")
    parser.add_argument("--linger-ms", type=float, help="the producer's linger_ms (default: its own)")
    parser.add_argument("--max-in-flight", type=int, help="the producer's max_in_flight per queue")
    parser.add_argument("--batch-bytes", type=int, help="the producer's batch_bytes")
    parser.add_argument("--compression", choices=["zstd", "lz4"], help="the producer's compression")
    parser.add_argument("--shard-keys", type=int, default=0,
                        help="spread sends over this many shard keys (default 0: round robin)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="produce single messages at this rate per second (latency mode)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds to produce (default 20)")
    parser.add_argument("--messages", type=int, default=0, help="consume, receive: load this many first")
    parser.add_argument("--read-from", default="follower", choices=["follower", "leader", "any"])
    parser.add_argument("--consumers", type=int, default=8, help="receive: SimpleConsumers (default 8)")
    parser.add_argument("--local", action="store_true", help="start a local cluster for the run")
    parser.add_argument("--groups", type=int, default=1,
                        help="--local: broker groups of 3 replicas (default 1; the topic spans them all)")
    parser.add_argument("--acl", action="store_true",
                        help="--local: with users and ACLs on; the client authenticates (SCRAM)")
    parser.add_argument("--namesrv", action="append")
    parser.add_argument("--servers")
    parser.add_argument("--dir")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_tls_arguments(parser, tls_help="with --local: the local cluster serves TLS on every port (a local "
                                       "CA); else TLS verified against the system's CAs")


def run_command(args: argparse.Namespace) -> int:

    async def run(where: dict[str, Any]) -> dict[str, Any]:
        async with AsyncAdmin(**where) as admin:
            topics = await admin.topics()
            if args.topic not in topics:
                await admin.create_topic(args.topic, 8)
        modes = {"produce": _produce, "consume": consume, "receive": receive}
        return await modes[args.mode](args, where)

    try:
        if args.local:
            with _local_cluster(args.groups, args.tls, args.acl) as where:
                result = asyncio.run(run(where))
        else:
            result = asyncio.run(run(client_kwargs(args)))
    except ClientError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    result["machine"] = f"{os.cpu_count()} cpus"
    result["tls"] = bool(args.tls or args.ca_file)
    result["acl"] = bool(args.acl)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>12}: {v}")
    return 0
