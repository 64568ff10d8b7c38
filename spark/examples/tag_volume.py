"""Per-tag counts and per-minute volume of a topic, read from the followers, into parquet.

With the local cluster of ``scripts/run`` up (another terminal), from the repository root::

    .venv/bin/python -m spark.examples.tag_volume --topic demo --send 20000

``--send N`` first creates the topic (8 queues) if needed and sends N demo messages;
without it the job reads an existing topic. The cluster is found like the ``raftmq``
command finds it: ``--namesrv``, ``--servers``, ``--dir`` (default ``run``, whose
``cluster.json`` names the name server) or ``$RAFTMQ_NAMESRV``. Results go to
``--out`` (default ``run/tag_volume``, next to the cluster's data): ``tag_counts/`` (tag, messages, bytes) and
``per_minute/`` (minute, messages, bytes), both parquet, and are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

__all__ = ["main"]

DEMO_TAGS = ("created", "paid", "shipped", "delivered", "refunded")


def _where(args: argparse.Namespace) -> tuple[str, str]:
    """("servers" | "namesrv", addresses) for the source's options."""
    if args.servers:
        return "servers", args.servers
    if args.namesrv:
        return "namesrv", args.namesrv
    if os.environ.get("RAFTMQ_NAMESRV"):
        return "namesrv", os.environ["RAFTMQ_NAMESRV"]
    state = Path(args.dir) / "cluster.json"
    if state.exists():
        return "namesrv", str(json.loads(state.read_text())["namesrv"]["address"])
    raise SystemExit(f"error: no cluster found: start one with scripts/run (it writes {state}), or give "
                     "--namesrv HOST:PORT or --servers A,B,C")


def _send_demo(kind: str, address: str, topic: str, n: int) -> None:
    from client import Admin, Message
    from client.aio import AsyncProducer

    where: dict[str, Any] = {"servers": address.split(",")} if kind == "servers" else {"namesrv": address}
    admin = Admin(**where)
    try:
        if topic not in admin.topics():
            admin.create_topic(topic, queues=8)
    finally:
        admin.close()

    async def run() -> None:
        rnd = random.Random(7)
        async with AsyncProducer(**where, group="tag-volume-demo") as p:
            for start in range(0, n, 1000):
                batch = [Message(topic, f"order {i}: {'x' * rnd.randrange(10, 500)}".encode(),
                                 tags=rnd.choice(DEMO_TAGS), keys=[f"order-{i}"])
                         for i in range(start, min(n, start + 1000))]
                await p.send_batch(batch, shard_key=f"customer-{start // 1000 % 16}")

    asyncio.run(run())
    print(f"sent {n} demo messages to {topic}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spark.examples.tag_volume",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--topic", required=True)
    ap.add_argument("--namesrv", help="name server(s), HOST:PORT[,HOST:PORT]")
    ap.add_argument("--servers", help="the nodes of one broker group, A,B,C (no name server)")
    ap.add_argument("--dir", default="run", help="a local cluster's directory (default: run)")
    ap.add_argument("--read-from", default="follower", choices=("follower", "leader", "any"))
    ap.add_argument("--send", type=int, default=0, metavar="N", help="first send N demo messages")
    ap.add_argument("--out", help="where the parquet goes (default: DIR/tag_volume, i.e. run/tag_volume)")
    args = ap.parse_args(argv)
    kind, address = _where(args)
    args.out = args.out or str(Path(args.dir) / "tag_volume")
    if args.send:
        _send_demo(kind, address, args.topic, args.send)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import functions as F

    from spark.datasource import local_session

    # a session of your own: spark.datasource.register(session) makes format("raftmq") known
    session = local_session("raftmq-tag-volume")
    try:
        messages = (session.read.format("raftmq").option(kind, address).option("topic", args.topic)
                    .option("readFrom", args.read_from).load()
                    .select("tags", "store_timestamp", F.length("body").alias("size"))
                    .cache())
        volume = [F.count("*").alias("messages"), F.sum("size").alias("bytes")]
        tags = (messages.groupBy(F.coalesce("tags", F.lit("(none)")).alias("tag")).agg(*volume)
                .orderBy(F.desc("messages")))
        minutes = (messages.groupBy(F.date_trunc("minute", "store_timestamp").alias("minute")).agg(*volume)
                   .orderBy("minute"))
        tags.write.mode("overwrite").parquet(f"{args.out}/tag_counts")
        minutes.write.mode("overwrite").parquet(f"{args.out}/per_minute")
        total = messages.count()
        print(f"{total} messages of topic {args.topic!r} (read from: {args.read_from}); "
              f"parquet in {args.out}/")
        tags.show(20, truncate=False)
        minutes.show(20, truncate=False)
    finally:
        session.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
