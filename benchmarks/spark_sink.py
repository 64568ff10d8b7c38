"""``python -m benchmarks.spark_sink``: rows/s of the ``raftmq`` sink with local[2] Spark, beside a
hand-written ``send_batch`` loop doing the same work and beside the source reading it back.

Starts a local 3-node broker group on 127.0.0.1 (a temporary directory), then per run:

* **native**: one ``AsyncProducer`` in this process sends ``--messages`` messages of
  ``--body-bytes`` bytes (one tag, one key, a shard key of ``--keys``) with ``send_batch``
  of 1,000 per shard key, the keys concurrently, into a fresh topic of ``--queues`` queues;
* **sink**: the same rows as a cached DataFrame of 2 partitions written with
  ``df.write.format("raftmq")`` into another fresh topic;
* **source**: that topic read back with ``format("raftmq")`` into Spark's ``noop`` sink
  (and the row count checked).

Prints rows/s of each and ``sink / native``, with the 1-minute load average when the run
started (the box may be shared). Every process it starts is stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _native(servers: list[str], topic: str, messages: int, keys: int, body_bytes: int) -> float:
    from client import Message
    from client.aio import AsyncProducer

    async def run() -> float:
        async with AsyncProducer(servers=servers, group="sink-bench", send_timeout=60.0) as producer:
            async def one_key(k: int) -> None:
                ids = range(k, messages, keys)
                for start in range(0, len(ids), 1000):
                    batch = [Message(topic, str(i).encode().ljust(body_bytes, b"."), tags="t",
                                     keys=[f"id-{i}"]) for i in ids[start:start + 1000]]
                    await producer.send_batch(batch, shard_key=f"k{k}")

            started = time.perf_counter()
            await asyncio.gather(*(one_key(k) for k in range(keys)))
            return time.perf_counter() - started

    return asyncio.run(run())


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.spark_sink", description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--keys", type=int, default=8)
    ap.add_argument("--body-bytes", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    return ap


def _create(servers: list[str], topic: str, queues: int) -> None:
    from client import Admin

    admin = Admin(servers=servers)
    try:
        admin.create_topic(topic, queues=queues)
    finally:
        admin.close()


def _one_run(i: int, session: Any, rows: Any, servers: list[str], args: argparse.Namespace) -> dict[str, Any]:
    n = args.messages
    load = os.getloadavg()[0]
    native_topic, sink_topic = f"native-{i}", f"sink-{i}"
    _create(servers, native_topic, args.queues)
    _create(servers, sink_topic, args.queues)
    native_s = _native(servers, native_topic, n, args.keys, args.body_bytes)
    started = time.perf_counter()
    (rows.write.format("raftmq").option("servers", ",".join(servers)).option("topic", sink_topic)
     .mode("append").save())
    sink_s = time.perf_counter() - started
    df = (session.read.format("raftmq").option("servers", ",".join(servers)).option("topic", sink_topic)
          .option("readFrom", "any").load())
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    source_s = time.perf_counter() - started
    got = df.count()
    if got != n:
        raise RuntimeError(f"read back {got} rows of {n}")
    row = {"run": i + 1, "load": round(load, 2), "native": round(n / native_s),
           "sink": round(n / sink_s), "source": round(n / source_s), "ratio": round(native_s / sink_s, 3)}
    print(f"run {i + 1} (load {load:.2f}): native send_batch {row['native']:,} rows/s, sink {row['sink']:,} "
          f"rows/s ({row['ratio']:.0%} of native), source read {row['source']:,} rows/s", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from raftmq.local_group import LocalGroup

    tmp = tempfile.TemporaryDirectory(prefix="raftmq-sink-bench-")
    group = LocalGroup(Path(tmp.name) / "g1", 3, module="broker", raft={"segment_bytes": 64 << 20},
                       broker={"index_slots": 4096, "index_entries": 65536}, log_level="WARNING")
    session: Any = None
    try:
        group.start()
        group.wait_leader(timeout=30)
        servers = [p.http for p in group.nodes.values()]
        from spark.datasource import local_session

        session = local_session("raftmq-sink-bench")
        rows = (session.range(0, args.messages, 1, 2)
                .selectExpr(f"rpad(cast(id as string), {args.body_bytes}, '.') as body", "'t' as tags",
                            "array(concat('id-', cast(id as string))) as keys",
                            f"concat('k', cast(id % {args.keys} as string)) as shard_key").cache())
        rows.count()
        _create(servers, "warm-up", args.queues)  # JVM, Python workers, connections
        (rows.limit(10_000).write.format("raftmq").option("servers", ",".join(servers))
         .option("topic", "warm-up").mode("append").save())
        runs = [_one_run(i, session, rows, servers, args) for i in range(args.runs)]
        print(f"median sink/native {sorted(r['ratio'] for r in runs)[len(runs) // 2]:.0%} "
              f"({args.messages} rows of {args.body_bytes} B, local[2], {os.cpu_count()} cpus)")
        return 0
    finally:
        if session is not None:
            session.stop()
        group.stop()
        tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
