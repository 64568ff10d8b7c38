"""The ``raftmq`` command line.

    raftmq up [--dir DIR] [--nodes 3]     a local cluster in the foreground (scripts/run):
                                          a name server + one broker group (--kind log: log nodes;
                                          --tls: TLS everywhere with a local CA)
    raftmq broker --config F              one broker replica (WebSocket server)
    raftmq namesrv --config F             a name server (topic routes) for the groups in F
    raftmq namesrv-key --config REPLICA   a group's registration key for the name servers
    raftmq cluster up|down|status|verify  a local cluster of background processes; verify
                                          compares every replica at a marker entry the
                                          leader proposes (exit 1 differ, 2 not compared)
    raftmq leader transfer [--to NODE]    move a group's leadership before maintenance
    raftmq replica init|forget --config F a replica's storage: founding a new group, or made a
                                          new one that votes once recorded (a restored backup)
    raftmq replica list|add|remove|replace  a group's members, one at a time
    raftmq log-node --config F --http A   one CommitLog replica (same as python -m dledger)
    raftmq log-status --http A            a replica's status as JSON
    raftmq bench-log ...                  CommitLog benchmark (scripts/bench-log)
    raftmq topic create|list              topics (client commands: see client/cli.py)
    raftmq send | consume | query         messages
    raftmq group progress|reset           consumer groups
    raftmq bench produce|consume          client benchmarks
    raftmq console [--listen H:P]         the web console (docs/CONSOLE.md)
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker import node
from broker.namesrv import server as namesrv
from client.cli import CLIENT_COMMANDS, add_client_commands, run_client_command
from console import command as console_command
from dledger.process import log_node
from raftmq import bench, bench_log, cluster_cmd, replica_cmd

__all__ = ["main"]


def _cmd_up(args: argparse.Namespace) -> int:
    if args.kind == "broker":
        return _up_brokers(args)
    if args.tls or args.mutual_tls:
        raise SystemExit("raftmq up: error: --tls is for brokers (log nodes serve plain HTTP)")
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
    where = ["--dir", args.dir, "--nodes", str(args.nodes), "--namesrv-port", str(args.namesrv_port),
             *(["--tls"] if args.tls else []), *(["--mutual-tls"] if args.mutual_tls else [])]
    stop = _stop_on_signals()
    try:
        if cluster_cmd.main(["up", *where]) != 0:
            return 1
        d = args.dir
        tls = ""
        if args.tls or args.mutual_tls:
            ca = Path(d).resolve() / "tls"
            cert = (f', cert_file="{ca}/client.pem", key_file="{ca}/client.key"' if args.mutual_tls else "")
            tls = f', tls=ClientTls(ca_file="{ca}/ca.pem"{cert})'
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
  from client import ClientTls, Producer, Message
  p = Producer(namesrv="{cluster_cmd.namesrv_address(d)}"{tls}).start()   # or RAFTMQ_NAMESRV
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


def _cmd_log_status(args: argparse.Namespace) -> int:
    try:
        with urllib.request.urlopen(f"http://{args.http}/status", timeout=5) as resp:
            print(json.dumps(json.loads(resp.read()), indent=2))
    except OSError as e:
        print(f"error: cannot reach {args.http}: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cmd in CLIENT_COMMANDS:
        return run_client_command(args)
    return int(args.run(args))


def build_parser() -> argparse.ArgumentParser:
    """The one tree of ``raftmq`` subcommands: each package adds its own arguments
    (``configure``) and runs them (``run``); nothing is forwarded as raw argv."""
    parser = argparse.ArgumentParser(
        prog="raftmq", description="RaftMQ: a RocketMQ-model broker on a Raft CommitLog.")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    up = sub.add_parser("up", help="run a local cluster on 127.0.0.1 in the foreground",
                        description="Run a local cluster on 127.0.0.1 in the foreground: a name server "
                                    "and one broker group, or bare log nodes (--kind log).")
    up.add_argument("--dir", default="run", help="data, configs and logs (default ./run)")
    up.add_argument("--nodes", type=int, default=3, help="replicas (default 3)")
    up.add_argument("--kind", choices=["log", "broker"], default="broker",
                    help="brokers with a name server (default) or bare log nodes (CommitLog only)")
    up.add_argument("--flush", choices=["sync", "async"], default="sync",
                    help="log nodes: fsync before ack (sync, default) or every few ms (async)")
    up.add_argument("--namesrv-port", type=int, default=cluster_cmd.default_namesrv_port(), metavar="PORT",
                    help="brokers: the name server's port (default $RAFTMQ_NAMESRV_PORT, else 9876 when "
                         "free, else a free one; 0: any free port)")
    up.add_argument("--tls", action="store_true",
                    help="brokers: TLS on every port, with a local CA made under DIR/tls (the commands "
                         "find it through DIR/cluster.json)")
    up.add_argument("--mutual-tls", action="store_true",
                    help="brokers: --tls, and clients must present the client certificate made there")
    up.set_defaults(run=_cmd_up)
    _add(sub, "broker", "run one broker replica", node.DESCRIPTION, node.configure, node.run)
    _add(sub, "namesrv", "run a name server (topic routes)", namesrv.DESCRIPTION, namesrv.configure,
         namesrv.run)
    _add(sub, "namesrv-key", "print or write a group's name-server registration key", namesrv.KEY_DESCRIPTION,
         namesrv.configure_key, namesrv.run_key)
    _add(sub, "cluster", "a local cluster in the background: up|down|status|verify",
         cluster_cmd.DESCRIPTION, cluster_cmd.configure, cluster_cmd.run)
    _add(sub, "leader", "leader transfer [--to NODE]: move a group's leadership",
         cluster_cmd.LEADER_DESCRIPTION, cluster_cmd.configure_leader, cluster_cmd.run_leader)
    _add(sub, "replica", "init|forget|list|add|remove|replace: a replica's storage, a group's members",
         replica_cmd.DESCRIPTION, replica_cmd.configure, replica_cmd.run, epilog=replica_cmd.EPILOG)
    _add(sub, "log-node", "run one CommitLog replica (as python -m dledger)", log_node.DESCRIPTION,
         log_node.configure, log_node.run)
    st = sub.add_parser("log-status", help="print a replica's status",
                        description="Print a replica's /status as JSON.")
    st.add_argument("--http", required=True, help="HOST:PORT of the replica's control API")
    st.set_defaults(run=_cmd_log_status)
    _add(sub, "bench-log", "benchmark a local CommitLog group (scripts/bench-log)",
         bench_log.DESCRIPTION, bench_log.configure, bench_log.run_command)
    _add(sub, "bench", "client benchmarks: produce|consume", bench.__doc__ or "", bench.configure,
         bench.run_command, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add(sub, "console", "serve the web console (cluster, topics, groups, messages, charts)",
         console_command.DESCRIPTION, console_command.configure, console_command.run)
    add_client_commands(sub)
    return parser


def _add(sub: Any, name: str, summary: str, description: str,
         configure: Callable[[argparse.ArgumentParser], None],
         run: Callable[[argparse.Namespace], int], **options: Any) -> None:
    command = sub.add_parser(name, help=summary, description=description, **options)
    configure(command)
    command.set_defaults(run=run)


if __name__ == "__main__":
    sys.exit(main())
