"""``python -m benchmarks.rocketmq_java_client``: the stock Apache RocketMQ 4.9.7 Java
client's send throughput against RaftMQ (issue 27), through the compat harness
(tests/compat/java, built by ``scripts/bootstrap --compat``)::

    sync   DefaultMQProducer.send of --size B messages from --threads threads (64)
    batch  DefaultMQProducer.send(Collection) of --batch messages (16) from --batch-threads (8)

against a local cluster (``raftmq cluster up``: a name server and a 3-node group, flush
sync) made for the run in a temporary directory, or ``--namesrv HOST:PORT`` (a RocketMQ
name server: RaftMQ's or, for comparison, ``scripts/reference-rocketmq``'s with
``--create-topic``). Each figure is acknowledged messages per second over --messages
messages after 50 warm-up sends; the JVM runs with a 256 MiB heap.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.compat.harness import run_java


@contextlib.contextmanager
def local_cluster() -> Iterator[str]:
    """A name server and a 3-node group under a temporary directory; its address."""
    from raftmq import cluster_cmd

    with tempfile.TemporaryDirectory(prefix="raftmq-bench-rmq-") as d:
        if cluster_cmd.main(["up", "--dir", d, "--namesrv-port", "0"]) != 0:
            raise SystemExit("error: the local cluster did not start")
        try:
            yield cluster_cmd.namesrv_address(d)
        finally:
            cluster_cmd.main(["down", "--dir", d])


def create_topic(namesrv: str, topic: str, queues: int) -> None:
    from client import Admin

    admin = Admin(namesrv=namesrv)
    try:
        admin.create_topic(topic, queues=queues)
    finally:
        admin.close()


def bench(
    namesrv: str, scenario: str, topic: str, logs: Path, create: bool, **opts: object
) -> dict[str, object]:
    args = [scenario, namesrv, f"topic={topic}", "timeoutS=300", *(f"{k}={v}" for k, v in opts.items())]
    if create:
        args.append("createTopic=true")
    run = run_java("raftmq.compat.Harness", args, timeout_s=330, log_dir=logs / scenario,
                   extra_flags=["-Xmx256m", "-XX:TieredStopAtLevel=4"])
    results = run.of("bench")
    if run.rc != 0 or not results:
        raise SystemExit(f"error: {scenario} did not finish\n{run.tail()}")
    return results[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--namesrv", help="a running RocketMQ name server (default: a local RaftMQ cluster)")
    ap.add_argument("--create-topic", action="store_true",
                    help="create the topic through UPDATE_AND_CREATE_TOPIC")
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--batch-threads", type=int, default=8)
    ap.add_argument("--queues", type=int, default=8)
    ap.add_argument("--only", choices=["sync", "batch"])
    args = ap.parse_args(argv)

    with contextlib.ExitStack() as stack:
        namesrv = args.namesrv or stack.enter_context(local_cluster())
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="raftmq-bench-java-")))
        topic = "bench-java"
        if not args.namesrv:
            create_topic(namesrv, topic, args.queues)
        out = []
        if args.only in (None, "sync"):
            out.append(bench(namesrv, "bench-sync", topic, logs, args.create_topic, count=args.messages,
                             size=args.size, threads=args.threads, queues=args.queues))
        if args.only in (None, "batch"):
            out.append(bench(namesrv, "bench-batch", topic, logs, args.create_topic, count=args.messages,
                             size=args.size, threads=args.batch_threads, batch=args.batch,
                             queues=args.queues))
    for r in out:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
