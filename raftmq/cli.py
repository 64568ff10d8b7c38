"""The ``raftmq`` command line.

    raftmq up [--dir DIR] [--nodes 3]     a local cluster in the foreground (scripts/run):
                                          a name server + one broker group (--kind log: log nodes)
    raftmq broker --config F              one broker replica (WebSocket server)
    raftmq namesrv [--listen H:P]         a name server (topic routes)
    raftmq cluster up|down|status|verify  a local cluster of background processes; verify
                                          compares every replica's state digests
    raftmq leader transfer [--to NODE]    move a group's leadership before maintenance
    raftmq log-node --config F --http A   one CommitLog replica (same as python -m dledger)
    raftmq log-status --http A            a replica's status as JSON
    raftmq bench-log ...                  CommitLog benchmark (scripts/bench-log)
    raftmq topic create|list              topics (client commands: see client/cli.py)
    raftmq send | consume | query         messages
    raftmq group progress|reset           consumer groups
    raftmq bench produce|consume          client benchmarks
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import urllib.request
from pathlib import Path

__all__ = ["main"]


def _cmd_up(args: argparse.Namespace) -> int:
    if args.kind == "broker":
        return _up_brokers(args)
    from raftmq.local_group import LocalGroup

    group = LocalGroup(Path(args.dir) / args.kind, args.nodes, raft={"flush": args.flush})
    stop = _stop_on_signals()
    try:
        group.start()
        print(f"starting {args.nodes} log nodes under {args.dir} ...", flush=True)
        leader = group.wait_leader(timeout=30)
        for name, node in group.nodes.items():
            role = "leader" if name == leader else "follower"
            print(f"  {name}: raft {node.raft}  http http://{node.http}  pid {node.proc.pid}  "
                  f"({role})")
        lead = group.nodes[leader].http
        print("\nappend an entry (to the leader):\n"
              f"  curl -s --data-binary 'hello' http://{lead}/propose\n"
              "read committed entries (any node; msgpack):\n"
              f"  curl -s 'http://{lead}/entries?from=1' | head -c 200\n"
              "status:\n"
              f"  raftmq log-status --http {lead}\n"
              f"logs: {group.base}/n*.log    Ctrl-C stops the group", flush=True)
        while not stop.wait(1.0):
            for name, node in group.nodes.items():
                if not node.alive:
                    print(f"{name} exited; see {group.base}/{name}.log", file=sys.stderr)
                    return 1
    finally:
        print("stopping ...", flush=True)
        group.stop()
    return 0


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return stop


def _up_brokers(args: argparse.Namespace) -> int:
    """A name server and one broker group in the foreground (``raftmq cluster`` underneath)."""
    from raftmq import cluster_cmd

    where = ["--dir", args.dir, "--nodes", str(args.nodes)]
    stop = _stop_on_signals()
    try:
        if cluster_cmd.main(["up", *where]) != 0:
            return 1
        d = args.dir
        print(f"""
try it (from this directory the commands find the cluster through {d}/cluster.json;
elsewhere add --dir {d}):
  raftmq topic create orders --queues 8
  raftmq send orders 'hello' --tags paid --keys order-42 --shard-key order-42
  raftmq consume orders --group billing --from first --idle 2
  raftmq query orders --key order-42
  raftmq group progress billing orders
  raftmq cluster status --dir {d}
from Python:
  from client import Producer, Message
  p = Producer(namesrv="{cluster_cmd.namesrv_address(d)}").start()
logs: {d}/namesrv.log, {d}/g1/n*.log    Ctrl-C stops the cluster""", flush=True)
        while not stop.wait(1.0):
            dead = cluster_cmd.dead_processes(d)
            if dead:
                print(f"exited: {', '.join(dead)}; see the logs under {d}", file=sys.stderr)
                return 1
    finally:
        print("stopping ...", flush=True)
        cluster_cmd.main(["down", "--dir", args.dir])
    return 0


def _cmd_log_node(args: argparse.Namespace, rest: list[str]) -> int:
    from dledger.log_node import main as log_node_main

    return log_node_main(rest)


def _cmd_log_status(args: argparse.Namespace) -> int:
    try:
        with urllib.request.urlopen(f"http://{args.http}/status", timeout=5) as resp:
            print(json.dumps(json.loads(resp.read()), indent=2))
    except OSError as e:
        print(f"error: cannot reach {args.http}: {e}", file=sys.stderr)
        return 1
    return 0


def _cmd_bench_log(args: argparse.Namespace, rest: list[str]) -> int:
    from raftmq.bench_log import main as bench_main

    return bench_main(rest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="raftmq", description="RaftMQ: a RocketMQ-model broker on a Raft CommitLog.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="run a local cluster on 127.0.0.1 in the foreground")
    up.add_argument("--dir", default="run", help="data, configs and logs (default ./run)")
    up.add_argument("--nodes", type=int, default=3, help="replicas (default 3)")
    up.add_argument("--kind", choices=["log", "broker"], default="broker",
                    help="brokers with a name server (default) or bare log nodes (CommitLog only)")
    up.add_argument("--flush", choices=["sync", "async"], default="sync",
                    help="log nodes: fsync before ack (sync, default) or every few ms (async)")
    sub.add_parser("broker", help="run one broker replica (see raftmq broker --help)",
                   add_help=False)
    sub.add_parser("namesrv", help="run a name server (see raftmq namesrv --help)", add_help=False)
    sub.add_parser("cluster", help="local cluster in the background: up|down|status|verify (see --help)",
                   add_help=False)
    sub.add_parser("leader", help="leader transfer [--to NODE]: move a group's leadership (see --help)",
                   add_help=False)
    sub.add_parser("replica", help="list|add|remove|replace: change a group's members (see --help)",
                   add_help=False)
    sub.add_parser("log-node", help="run one CommitLog replica (see python -m dledger --help)",
                   add_help=False)
    st = sub.add_parser("log-status", help="print a replica's status")
    st.add_argument("--http", required=True, help="HOST:PORT of the replica's control API")
    sub.add_parser("bench-log", help="benchmark a local group (see --help)", add_help=False)
    sub.add_parser("bench", help="client benchmarks: produce|consume (see raftmq bench --help)",
                   add_help=False)
    from client.cli import CLIENT_COMMANDS, add_client_commands, run_client_command

    add_client_commands(sub)
    args, rest = parser.parse_known_args(argv)
    if args.cmd == "bench":
        from raftmq.bench import main as bench_main

        return bench_main(rest)
    if args.cmd in CLIENT_COMMANDS:
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return run_client_command(args)
    if args.cmd == "log-node":
        return _cmd_log_node(args, rest)
    if args.cmd == "broker":
        from broker.node import main as broker_main

        return broker_main(rest)
    if args.cmd == "cluster":
        from raftmq.cluster_cmd import main as cluster_main

        return cluster_main(rest)
    if args.cmd == "leader":
        from raftmq.cluster_cmd import leader_main

        return leader_main(rest)
    if args.cmd == "replica":
        from raftmq.replica_cmd import main as replica_main

        return replica_main(rest)
    if args.cmd == "namesrv":
        from broker.namesrv import main as namesrv_main

        return namesrv_main(rest)
    if args.cmd == "bench-log":
        return _cmd_bench_log(args, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return {"up": _cmd_up, "log-status": _cmd_log_status}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
