"""``raftmq cluster up|down|status --dir DIR``: a local cluster of background processes.

``up`` starts a name server and ``--groups`` broker groups of ``--nodes`` replicas
on 127.0.0.1, writes every address and PID to ``DIR/cluster.json`` and returns
once every group has a leader. ``down`` stops them by PID (SIGTERM, then SIGKILL
after 10 s). ``status`` prints each replica's role, term and indexes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from dledger.local_group import LocalGroup, free_port

__all__ = ["dead_processes", "main", "namesrv_address"]


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
    ns = f"127.0.0.1:{free_port()}"
    with open(root / "namesrv.log", "ab") as out:
        namesrv = subprocess.Popen([sys.executable, "-m", "broker.cli", "namesrv", "--listen", ns],
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    state: dict[str, Any] = {"namesrv": {"address": ns, "pid": namesrv.pid}, "groups": {}}
    groups = {}
    for i in range(args.groups):
        name = f"g{i + 1}"
        group = LocalGroup(root / name, args.nodes, module="broker", group=name,
                           broker={"namesrv": [ns]}, log_level="WARNING")
        group.start()
        groups[name] = group
        state["groups"][name] = {n: {"raft": p.raft, "address": p.http, "pid": p.proc.pid}
                                 for n, p in group.nodes.items()}
    state_path.write_text(json.dumps(state, indent=2))
    print(f"name server {ns} (pid {namesrv.pid}); waiting for leaders ...", flush=True)
    for name, group in groups.items():
        try:
            leader = group.wait_leader(timeout=args.timeout)
        except TimeoutError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"  {name}: leader {leader} at {group.nodes[leader].http}", flush=True)
    print(f"cluster up; state in {state_path}; stop it with `raftmq cluster down --dir {root}`")
    return 0


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


def _status(args: argparse.Namespace) -> int:
    state_path = Path(args.dir) / "cluster.json"
    if not state_path.exists():
        print(f"no cluster.json under {args.dir}", file=sys.stderr)
        return 1
    state = json.loads(state_path.read_text())
    print(f"name server {state['namesrv']['address']} "
          f"({'up' if _pid_alive(state['namesrv']['pid']) else 'DOWN'})")
    print(f"{'group':6} {'node':5} {'address':22} {'role':10} {'term':>5} {'commit':>8} {'applied':>8}")
    for group, nodes in state["groups"].items():
        for node, info in nodes.items():
            try:
                with urllib.request.urlopen(f"http://{info['address']}/status", timeout=2) as resp:
                    s = json.loads(resp.read())
                row = (s["role"], s["term"], s["commit_index"], s["applied_index"])
            except OSError:
                row = ("DOWN", "-", "-", "-")
            print(f"{group:6} {node:5} {info['address']:22} {row[0]:10} {row[1]!s:>5} "
                  f"{row[2]!s:>8} {row[3]!s:>8}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raftmq cluster",
                                     description="Run a local RaftMQ cluster in the background.")
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--dir", required=True, help="where configs, data, logs and cluster.json go")
    parser.add_argument("--nodes", type=int, default=3, help="replicas per group (default 3)")
    parser.add_argument("--groups", type=int, default=1, help="broker groups (default 1)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for leaders")
    args = parser.parse_args(argv)
    return {"up": _up, "down": _down, "status": _status}[args.action](args)
