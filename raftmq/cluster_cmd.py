"""``raftmq cluster up|down|status|verify``: a local cluster of background processes, and
checks of any cluster.

``up`` starts a name server and ``--groups`` broker groups of ``--nodes`` replicas
on 127.0.0.1 -- the name server on RocketMQ's 127.0.0.1:9876 when that port is free (else on
a free port, saying so; ``--namesrv-port`` or ``$RAFTMQ_NAMESRV_PORT`` choose another, 0 any),
writes every address and PID to ``DIR/cluster.json`` and returns
once every group has a leader; the name server is given each group's registration key
(``raftmq.local_namesrv``). With ``--tls`` every process serves TLS with certificates of a
local CA made under ``DIR/tls`` (``raftmq.local_tls``; ``--mutual-tls``: clients must present
the client certificate made there too), and cluster.json names the CA and that
certificate, so commands given ``--dir`` (or run where ``./run`` is the cluster) use them.
``down`` stops them by PID (SIGTERM, then SIGKILL after 10 s). ``status`` prints each
replica's role, term, indexes, retained log start, newest snapshot, disk use and health.
``verify`` has each group's leader propose a marker entry at which every replica digests
its derived state and reads back its ConsumeQueue units, compares them, and says what it
compared (``raftmq.cluster_verify``): exit 0 equal, 1 a difference (replica and queue
named) or an unhealthy replica, 2 something not compared (a replica down or behind).
``status`` and ``verify`` find the replicas in ``--dir``'s cluster.json or ask a name
server (``--namesrv``), over https when the cluster serves TLS (``raftmq.cluster_http``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from client.cli_cluster import add_tls_arguments
from client.errors import AuthFailedError
from raftmq.cluster_http import ClusterHttp
from raftmq.cluster_verify import EXIT_INCOMPLETE, verify_groups
from raftmq.local_acl import acl_broker_options, wait_for_super_user
from raftmq.local_group import LocalGroup, free_port
from raftmq.local_namesrv import configure_namesrv, namesrv_argv
from raftmq.local_tls import LocalCA

__all__ = ["DEFAULT_NAMESRV_PORT", "choose_namesrv_port", "dead_processes", "default_namesrv_port",
           "find_group", "find_replicas", "leader_main", "main", "namesrv_address"]

#: RocketMQ's name server port: where a RocketMQ user's first ``Producer`` looks.
DEFAULT_NAMESRV_PORT = 9876


def _pid_alive(pid: int) -> bool:
    try:  # our own child that exited is a zombie until reaped: reap it
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _up(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    state_path = root / "cluster.json"
    if state_path.exists() and any(_pid_alive(p) for p in _pids(json.loads(state_path.read_text()))):
        print(f"a cluster is already running under {root}; run `raftmq cluster down --dir {root}`",
              file=sys.stderr)
        return 1
    root.mkdir(parents=True, exist_ok=True)
    ns = f"127.0.0.1:{choose_namesrv_port(args.namesrv_port)}"
    mutual = bool(getattr(args, "mutual_tls", False))
    ca = LocalCA(root / "tls").ensure() if getattr(args, "tls", False) or mutual else None
    acl = acl_broker_options(root) if getattr(args, "acl", False) else {}  # users and ACLs on
    groups = {f"g{i + 1}": LocalGroup(root / f"g{i + 1}", args.nodes, module="broker", group=f"g{i + 1}",
                                      broker={"namesrv": [ns], **acl}, log_level="WARNING", tls=ca or False,
                                      mutual_tls=mutual)
              for i in range(args.groups)}
    config = configure_namesrv(root, ns, groups.values(),  # the groups' keys, from their secrets
                               tls=ca.server_tls(mutual) if ca is not None else None)
    with open(root / "namesrv.log", "ab") as out:
        namesrv = subprocess.Popen(namesrv_argv(config), stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    state: dict[str, Any] = {"namesrv": {"address": ns, "pid": namesrv.pid}, "groups": {}}
    if ca is not None:
        client = ca.client_tls(with_cert=True)
        state["tls"] = {"ca_file": client.ca_file, "cert_file": client.cert_file, "key_file": client.key_file,
                        "mutual": mutual}
    for name, group in groups.items():
        group.start()
        state["groups"][name] = {n: {"raft": p.raft, "address": p.http, "pid": p.proc.pid}
                                 for n, p in group.nodes.items()}
    state_path.write_text(json.dumps(state, indent=2))
    scheme = "https" if ca is not None else "http"
    print(f"name server {scheme}://{ns} (pid {namesrv.pid}); waiting for leaders ...", flush=True)
    for name, group in groups.items():
        try:
            leader = group.wait_leader(timeout=args.timeout)
        except TimeoutError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"  {name}: leader {leader} at {group.nodes[leader].http}", flush=True)
    print(f"cluster up; state in {state_path}; stop it with `raftmq cluster down --dir {root}`")
    if acl:
        try:
            wait_for_super_user(ns, root, tls=ca.client_tls(with_cert=True) if ca else False,
                                timeout=args.timeout)
        except TimeoutError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"ACLs on: super user credentials in {root / 'admin.credentials'} "
              f"(export RAFTMQ_CREDENTIALS_FILE={root / 'admin.credentials'})")
    return 0


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the name server will bind
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def choose_namesrv_port(wanted: int) -> int:
    """``wanted`` when it is free on 127.0.0.1, else (or for 0) a free port; a taken
    ``wanted`` is said on stderr with the port chosen instead."""
    if wanted and _port_free(wanted):
        return wanted
    port = free_port()
    if wanted:
        print(f"127.0.0.1:{wanted} is taken: the name server listens on 127.0.0.1:{port} instead "
              f"(clients: namesrv=\"127.0.0.1:{port}\" or RAFTMQ_NAMESRV=127.0.0.1:{port})",
              file=sys.stderr, flush=True)
    return port


def namesrv_address(root: str | Path) -> str:
    return str(json.loads((Path(root) / "cluster.json").read_text())["namesrv"]["address"])


def dead_processes(root: str | Path) -> list[str]:
    """Names of the cluster's processes that are no longer running."""
    state = json.loads((Path(root) / "cluster.json").read_text())
    dead = [] if _pid_alive(state["namesrv"]["pid"]) else ["namesrv"]
    for group, nodes in state["groups"].items():
        dead += [f"{group}/{n}" for n, info in nodes.items() if not _pid_alive(info["pid"])]
    return dead


def _pids(state: dict[str, Any]) -> list[int]:
    pids = [state["namesrv"]["pid"]]
    for nodes in state["groups"].values():
        pids += [n["pid"] for n in nodes.values()]
    return pids


def _down(args: argparse.Namespace) -> int:
    state_path = Path(args.dir) / "cluster.json"
    if not state_path.exists():
        print(f"no cluster.json under {args.dir}: nothing to stop", file=sys.stderr)
        return 1
    pids = [p for p in _pids(json.loads(state_path.read_text())) if _pid_alive(p)]
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(_pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in [p for p in pids if _pid_alive(p)]:
        os.kill(pid, signal.SIGKILL)
    print(f"stopped {len(pids)} processes")
    return 0


def find_replicas(args: argparse.Namespace) -> dict[str, dict[str, str]] | None:
    """group -> node -> client address, from --namesrv or --dir's cluster.json."""
    if args.namesrv:
        doc = ClusterHttp.of(args).get(args.namesrv, "/cluster")
        return {g: {n: info["address"] for n, info in nodes.items()} for g, nodes in doc.items()}
    state_path = Path(args.dir or ".") / "cluster.json"
    if not state_path.exists():
        print(f"no cluster.json under {args.dir or '.'}; give --dir or --namesrv", file=sys.stderr)
        return None
    state = json.loads(state_path.read_text())
    print(f"name server {state['namesrv']['address']} "
          f"({'up' if _pid_alive(state['namesrv']['pid']) else 'DOWN'})")
    return {g: {n: info["address"] for n, info in nodes.items()} for g, nodes in state["groups"].items()}


def find_group(args: argparse.Namespace) -> dict[str, str] | None:
    """node -> client address of the one group ``args`` name: ``--servers``, or ``--group``
    among those ``find_replicas`` finds (needed when there are several). None after
    printing why not."""
    if args.servers:
        return {a: a for a in args.servers.split(",") if a}
    groups = find_replicas(args)
    if groups is None:
        return None
    if args.group:
        if args.group not in groups:
            print(f"error: no group {args.group!r} (groups: {', '.join(sorted(groups))})", file=sys.stderr)
            return None
        return groups[args.group]
    if len(groups) > 1:
        print(f"error: several groups ({', '.join(sorted(groups))}): give --group", file=sys.stderr)
        return None
    (nodes,) = groups.values()
    return nodes


def _replica_status(http: ClusterHttp, address: str) -> dict[str, Any] | None:
    try:
        return dict(http.get(address, "/status", timeout=2))
    except (OSError, ValueError):
        return None


def _status(args: argparse.Namespace) -> int:
    groups = find_replicas(args)
    if groups is None:
        return 1
    http = ClusterHttp.of(args)
    print(f"{'group':6} {'node':5} {'address':22} {'role':10} {'term':>5} {'commit':>8} {'applied':>8} "
          f"{'log from':>8} {'snapshot':>8} {'log MiB':>8} {'free GiB':>8}  health")
    for group, nodes in groups.items():
        for node, address in nodes.items():
            s = _replica_status(http, address)
            if s is None:
                print(f"{group:6} {node:5} {address:22} DOWN")
                continue
            disk = s.get("disk", {})
            health = "ok" if s.get("healthy", True) else f"UNHEALTHY: {s.get('apply_stalled') or 'divergent'}"
            print(f"{group:6} {node:5} {address:22} {s['role']:10} {s['term']:>5} {s['commit_index']:>8} "
                  f"{s['applied_index']:>8} {s['first_index']:>8} {s.get('snapshot_index') or '-'!s:>8} "
                  f"{disk.get('commitlog_bytes', 0) / 2**20:>8.1f} {disk.get('free_bytes', 0) / 2**30:>8.1f}"
                  f"  {health}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    groups = find_replicas(args)
    if groups is None:
        return EXIT_INCOMPLETE
    return verify_groups(groups, ClusterHttp.of(args), args.timeout)


DESCRIPTION = "Run a local RaftMQ cluster in the background, or inspect and verify a cluster."
LEADER_DESCRIPTION = (
    "Move a group's leadership (before maintenance on its leader): the leader pauses writes, "
    "waits until the target holds every entry and hands over (Raft's TimeoutNow); writes stall "
    "for about an election round trip.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raftmq cluster", description=DESCRIPTION)
    configure(parser)
    return run(parser.parse_args(argv))


def configure(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``raftmq cluster``."""
    parser.add_argument("action", choices=["up", "down", "status", "verify"],
                        help="up/down: a local cluster in --dir; status: each replica's role, indexes, "
                             "retained log, snapshot, disk, health; verify: the leader of each group "
                             "proposes a marker entry, every replica digests its state and reads back "
                             "its ConsumeQueue units there, and they are compared (exit 0: compared "
                             "and equal; 1: a difference, replica and queue named; 2: something could "
                             "not be compared, e.g. a replica down or behind)")
    parser.add_argument("--dir", help="where configs, data, logs and cluster.json go (up, down; "
                                      "status and verify read its cluster.json)")
    parser.add_argument("--namesrv", help="status, verify: find the replicas through this name server")
    parser.add_argument("--nodes", type=int, default=3, help="replicas per group (default 3)")
    parser.add_argument("--groups", type=int, default=1, help="broker groups (default 1)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="up: seconds to wait for leaders; verify: seconds each replica has to apply "
                             "the marker and digest at it (default 60)")
    parser.add_argument("--acl", action="store_true",
                        help="up: users and ACLs on, a super user 'admin' in DIR/admin.credentials")
    parser.add_argument("--namesrv-port", type=int, default=default_namesrv_port(), metavar="PORT",
                        help=f"up: the name server's port on 127.0.0.1 (default $RAFTMQ_NAMESRV_PORT, else "
                             f"{DEFAULT_NAMESRV_PORT} when free, else a free one; 0: any free port)")
    parser.add_argument("--mutual-tls", action="store_true",
                        help="up: --tls, and clients must present a certificate of the local CA")
    add_tls_arguments(parser, tls_help="up: serve TLS everywhere with certificates of a local CA made "
                                       "under DIR/tls; status, verify: TLS verified against the system's CAs")


def default_namesrv_port() -> int:
    text = os.environ.get("RAFTMQ_NAMESRV_PORT", "")
    return int(text) if text.isdigit() else DEFAULT_NAMESRV_PORT


def run(args: argparse.Namespace) -> int:
    if args.action in ("up", "down") and not args.dir:
        raise SystemExit(f"raftmq cluster: error: {args.action} needs --dir")
    return {"up": _up, "down": _down, "status": _status, "verify": _verify}[args.action](args)


def leader_main(argv: list[str] | None = None) -> int:
    """``raftmq leader transfer [--to NODE] [--group G] (--dir D | --namesrv NS | --servers A,B)``."""
    parser = argparse.ArgumentParser(prog="raftmq leader", description=LEADER_DESCRIPTION)
    configure_leader(parser)
    return run_leader(parser.parse_args(argv))


def configure_leader(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``raftmq leader``."""
    parser.add_argument("action", choices=["transfer"])
    parser.add_argument("--to", help="the replica to lead (default: the most up-to-date follower)")
    parser.add_argument("--group", help="the broker group (needed when there are several)")
    parser.add_argument("--dir", help="a local cluster's directory (its cluster.json)")
    parser.add_argument("--namesrv", help="find the replicas through this name server")
    parser.add_argument("--servers", help="one group's replica addresses, comma separated")
    add_tls_arguments(parser)


def run_leader(args: argparse.Namespace) -> int:
    nodes = find_group(args)
    if nodes is None:
        return 1
    http = ClusterHttp.of(args)
    leader = next((a for a in nodes.values()
                   if (_replica_status(http, a) or {}).get("role") == "leader"), None)
    if leader is None:
        print("error: no replica of the group says it leads (an election is under way?)", file=sys.stderr)
        return 1
    try:
        body = {"to": args.to} if args.to else {}
        code, doc = http.call(leader, "/admin/leader/transfer", body, timeout=15)
    except OSError as e:
        print(f"error: cannot reach the leader at {leader}: {e}", file=sys.stderr)
        return 1
    except AuthFailedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if code != 200:
        print(f"error: {doc.get('error', code)}", file=sys.stderr)
        return 1
    print(f"leader is now {doc['leader']} ({doc.get('leader_address')})")
    return 0
