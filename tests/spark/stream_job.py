"""A streaming copy of a topic into parquet, or into another topic through the ``raftmq``
sink, run as its own process by the streaming tests (which kill it with SIGKILL mid-batch
and start it again on the same checkpoint).

    python -m tests.spark.stream_job --servers A,B,C --topic T --checkpoint DIR
        (--out DIR | --sink-topic T2 [--request-messages N])
        [--trigger available|processing] [--max-per-trigger N] [--seconds S]

With ``--sink-topic`` each message is copied with its body, tags, keys and properties,
sharded by its property ``k``.

``available``: Trigger.AvailableNow, exits when caught up. ``processing``: a
processingTime trigger of 300 ms for ``--seconds``, then stops. Exit status 0 only
if the query ended without error.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--servers", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--out")
    ap.add_argument("--sink-topic")
    ap.add_argument("--request-messages", type=int, default=1024)
    ap.add_argument("--trigger", choices=("available", "processing"), default="available")
    ap.add_argument("--max-per-trigger", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from spark.datasource import local_session

    session = local_session("raftmq-stream-job")
    reader = (session.readStream.format("raftmq").option("servers", args.servers).option("topic", args.topic)
              .option("startingOffsets", "earliest"))
    if args.max_per_trigger:
        reader = reader.option("maxRecordsPerTrigger", str(args.max_per_trigger))
    if args.sink_topic:
        copied = reader.load().selectExpr("body", "tags", "keys", "properties",
                                          "properties['k'] as shard_key")
        writer = (copied.writeStream.format("raftmq").option("checkpointLocation", args.checkpoint)
                  .option("servers", args.servers).option("topic", args.sink_topic)
                  .option("requestMessages", str(args.request_messages)))
    else:
        writer = (reader.load().select("broker_group", "queue_id", "queue_offset", "msg_id", "tags")
                  .writeStream.format("parquet").option("checkpointLocation", args.checkpoint)
                  .option("path", args.out))
    if args.trigger == "available":
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination(args.seconds)
        done = not query.isActive
    else:
        query = writer.trigger(processingTime="300 milliseconds").start()
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline and query.isActive:
            time.sleep(0.2)
        done = True
    query.stop()
    error = query.exception()
    session.stop()
    if error is not None:
        print(f"query failed: {error}", file=sys.stderr, flush=True)
        return 1
    if not done:
        print(f"query did not finish within {args.seconds} s", file=sys.stderr, flush=True)
        return 1
    print("query done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
