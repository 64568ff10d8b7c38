"""``python -m benchmarks.spark``: rows/s a local[2] Spark batch job reads from the followers.

Starts a local 3-node broker group on 127.0.0.1 (under ``--dir``, default a temporary
directory), fills a topic of ``--queues`` queues with ``--messages`` messages of
``--body-bytes`` bytes (tags and one key each), waits until the followers applied all of
it, then reads the whole topic with ``format("raftmq")`` into Spark's ``noop`` sink
(every column materialised) ``--runs`` times after one warm-up read; ``--sink count``
times ``df.count()`` instead (the same reads, without Spark materialising rows). Prints
rows/s per run, the messages each node served (the leader must serve none) and the CPU
seconds of the brokers, the Spark JVM and its Python workers during each timed run (and
the CPU microseconds per row of each kind of process, for both reads below), with the
1-minute load average when the run started (the box may be shared).
Every process it starts is stopped by PID at the end.

Each run also times Spark alone on the same schema: a source of as many partitions that
yields ready-made Arrow batches of the same rows' shape (no brokers, no decoding), into
the same sink -- the ceiling the raftmq source is compared with (``ratio``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parent[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found: list[int] = []
    frontier = {pid}
    while frontier:
        frontier = {c for c, p in parent.items() if p in frontier and c not in found}
        found += sorted(frontier)
    return found


def _kind(name: str, pid: int) -> str:
    """The row of the CPU table a watched process counts in."""
    if name.startswith("broker"):
        return "leader" if "leader" in name else "followers"
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        comm = ""
    return "spark jvm" if comm == "java" else "python workers"


class _CpuWindow:
    """CPU seconds each watched process (name -> pid) and this driver used inside the block."""

    def __init__(self, watched: dict[str, int]) -> None:
        self.watched = watched
        self.used: dict[str, float] = {}

    def __enter__(self) -> _CpuWindow:
        self._start = {k: _cpu_seconds(p) for k, p in self.watched.items()}
        self._own = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.used = {k: round(_cpu_seconds(p) - self._start[k], 2) for k, p in self.watched.items()}
        self.used["bench driver (python)"] = round(time.process_time() - self._own, 2)
        self.kinds = {k: _kind(k, p) for k, p in self.watched.items()}
        self.kinds["bench driver (python)"] = "driver"


def _per_row(window: _CpuWindow, rows: int) -> dict[str, float]:
    """CPU microseconds per row by kind of process (leader, followers, spark jvm, python
    workers, driver) and in all."""
    out: dict[str, float] = {}
    for name, seconds in window.used.items():
        kind = window.kinds[name]
        out[kind] = out.get(kind, 0.0) + seconds
    per = {k: round(v * 1e6 / rows, 2) for k, v in sorted(out.items())}
    per["total"] = round(sum(out.values()) * 1e6 / rows, 2)
    return per


def _timed(df: Any, sink: str, expected: int) -> float:
    started = time.monotonic()
    if sink == "noop":
        df.write.format("noop").mode("overwrite").save()
    else:
        got = df.count()
        if got != expected:
            raise SystemExit(f"error: read {got} rows, expected {expected}")
    return time.monotonic() - started


def _pulled(addresses: dict[str, str]) -> dict[str, float]:
    out = {}
    for name, address in addresses.items():
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("raftmq_messages_pulled_total"):
                    out[name] = float(line.rsplit(" ", 1)[1])
    return out


def _fill(servers: list[str], topic: str, queues: int, messages: int, body_bytes: int) -> float:
    from client.aio import AsyncProducer
    from client.message import Message
    from client.queues import MessageQueue, shard_queue

    mqs = [MessageQueue(topic, "g1", q) for q in range(queues)]
    keys: dict[int, str] = {}
    j = 0
    while len(keys) < queues:
        keys.setdefault(shard_queue(f"bench-{j}", mqs).queue_id, f"bench-{j}")
        j += 1
    per_queue = messages // queues
    tags = ("red", "green", "blue", "gold", "grey")

    async def run() -> None:
        async with AsyncProducer(servers=servers, group="spark-bench", send_timeout=60.0) as p:
            async def one(q: int) -> None:
                for start in range(0, per_queue, 1000):
                    batch = [Message(topic, os.urandom((body_bytes + 1) // 2).hex().encode()[:body_bytes],
                                     tags=tags[i % len(tags)], keys=[f"q{q}-{i}"])
                             for i in range(start, min(per_queue, start + 1000))]
                    await p.send_batch(batch, shard_key=keys[q])

            await asyncio.gather(*(one(q) for q in range(queues)))

    started = time.monotonic()
    asyncio.run(run())
    return time.monotonic() - started


def _alone_source(rows: int, partitions: int, body_bytes: int, batch_rows: int) -> Any:
    """A DataSource ("raftmq_alone") of ``partitions`` partitions yielding ``rows`` rows in
    all, in ready-made Arrow batches of the raftmq schema (built once per partition)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from spark.arrow import SCHEMA_DDL

    class Alone(DataSource):
        @classmethod
        def name(cls) -> str:
            return "raftmq_alone"

        def schema(self) -> str:
            return SCHEMA_DDL

        def reader(self, schema: Any) -> DataSourceReader:
            return AloneReader()

    class AloneReader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(i) for i in range(partitions)]

        def read(self, partition: InputPartition) -> Any:
            from spark.arrow import to_record_batch
            from spark.pages import Columns
            n = min(batch_rows, rows // partitions)
            cols = Columns("bench", "g1", partition.value, queue_offset=list(range(n)),
                           commit_log_offset=list(range(1000, 1000 + n)), store_ms=[1_700_000_000_000] * n,
                           msg_ids=bytearray(os.urandom(16 * n)), born_base_ms=[1_700_000_000_000] * n,
                           born_delta_ms=[0] * n, keys=[("k",)] * n, tags=["red"] * n, properties=[{}] * n,
                           body=[os.urandom(body_bytes)] * n)
            batch = to_record_batch(cols)
            left = rows // partitions
            while left > 0:
                yield batch if left >= n else batch.slice(0, left)
                left -= n

    return Alone


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.spark", description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--body-bytes", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sink", choices=("noop", "count"), default="noop",
                    help="noop: write every column to Spark's noop sink; count: df.count()")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="a further option of the raftmq source (repeatable), e.g. pipeline=4")
    ap.add_argument("--dir", help="where the brokers keep data and logs (default: a temporary directory)")
    ap.add_argument("--out", help="also write the results as JSON to this file")
    return ap


def _filled(group: Any, args: argparse.Namespace) -> tuple[str, dict[str, str], int]:
    """Topic ``bench`` filled through ``group`` (started) and applied on every follower:
    (the leader, every replica's address, the messages stored)."""
    from client import Admin

    leader = group.wait_leader(timeout=30)
    addresses = {n: p.http for n, p in group.nodes.items()}
    servers = list(addresses.values())
    admin = Admin(servers=servers)
    try:
        admin.create_topic("bench", queues=args.queues)
    finally:
        admin.close()
    fill_s = _fill(servers, "bench", args.queues, args.messages, args.body_bytes)
    expected = args.messages // args.queues * args.queues
    target = group.status(leader)["commit_index"]
    for name in addresses:
        if name != leader:
            group.wait_status(name, lambda s: s.get("applied_index", 0) >= target, 120, "catch-up")
    print(f"filled topic bench: {expected} messages of {args.body_bytes} B in {fill_s:.1f} s", flush=True)
    return leader, addresses, expected


def _run(i: int, df: Any, alone: Any, args: argparse.Namespace, watched: dict[str, int],
         addresses: dict[str, str], expected: int) -> dict[str, Any]:
    """One measured read of ``df`` (CPU of every ``watched`` process, messages each replica
    served), then of the Spark-only source ``alone``; its row of the results."""
    load = os.getloadavg()[0]
    before = _pulled(addresses)
    with _CpuWindow(watched) as raftmq_cpu:
        took = _timed(df, args.sink, expected)
    after = _pulled(addresses)
    served = {n: int(after[n] - before[n]) for n in after}
    with _CpuWindow(watched) as alone_cpu:
        alone_took = _timed(alone, args.sink, expected)
    row = {"run": i + 1, "load_1min": round(load, 2), "seconds": round(took, 3),
           "rows_per_s": round(expected / took),
           "spark_alone_rows_per_s": round(expected / alone_took),
           "ratio": round(alone_took / took, 3), "served": served,
           "cpu_us_per_row": _per_row(raftmq_cpu, expected),
           "alone_cpu_us_per_row": _per_row(alone_cpu, expected),
           "cpu_s": {k: v for k, v in raftmq_cpu.used.items() if v > 0}}
    print(f"run {i + 1} (load {load:.2f}): {expected} rows in {took:.2f} s = "
          f"{expected / took:,.0f} rows/s "
          f"(Spark alone {expected / alone_took:,.0f} rows/s: {alone_took / took:.0%}); "
          f"served {served}; CPU us/row {row['cpu_us_per_row']}, "
          f"alone {row['alone_cpu_us_per_row']}", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from raftmq.local_group import LocalGroup

    tmp = None if args.dir else tempfile.TemporaryDirectory(prefix="raftmq-spark-bench-")
    base = Path(args.dir or tmp.name)  # type: ignore[union-attr]
    group = LocalGroup(base / "g1", 3, module="broker", raft={"segment_bytes": 64 << 20},
                       broker={"index_slots": 4096, "index_entries": 65536}, log_level="WARNING")
    session: Any = None
    try:
        group.start()
        leader, addresses, expected = _filled(group, args)

        from spark.datasource import local_session
        session = local_session("raftmq-spark-bench")
        options = dict(o.split("=", 1) for o in args.option)
        df = (session.read.format("raftmq").option("servers", ",".join(addresses.values()))
              .option("topic", "bench").options(**options).load())
        got = df.count()  # warm-up: JVM, Python workers, connections
        if got != expected:
            print(f"error: read {got} rows, expected {expected}", file=sys.stderr)
            return 1
        session.dataSource.register(_alone_source(expected, args.queues, args.body_bytes, 8192))
        alone = session.read.format("raftmq_alone").load()
        alone.write.format("noop").mode("overwrite").save()  # its warm-up
        brokers = {n: p.proc.pid for n, p in group.nodes.items() if p.proc is not None}
        broker_pids = set(brokers.values())
        spark_pids: list[int] = []
        runs = []
        for i in range(args.runs):
            spark_pids = sorted((set(spark_pids) | set(_descendants(os.getpid()))) - broker_pids)
            watched = {**{f"broker {n}{' (leader)' if n == leader else ''}": p for n, p in brokers.items()},
                       **{f"spark pid {p}": p for p in spark_pids}}
            runs.append(_run(i, df, alone, args, watched, addresses, expected))
            served = runs[-1]["served"]
            if served.get(leader, 0) != 0:
                print(f"error: the leader {leader} served {served[leader]} messages", file=sys.stderr)
                return 1
        result = {"messages": expected, "body_bytes": args.body_bytes, "queues": args.queues,
                  "sink": args.sink, "options": options, "cpus": os.cpu_count(), "runs": runs}
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=2))
        best = max(r["rows_per_s"] for r in runs)
        print(f"best {best:,} rows/s ({args.body_bytes} B bodies, local[2], {os.cpu_count()} cpus)")
        return 0
    finally:
        if session is not None:
            session.stop()
        group.stop()
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
