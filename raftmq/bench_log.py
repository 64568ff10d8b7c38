"""CommitLog benchmark: a local group under load from a separate process.

Starts a fresh local group (``LocalGroup``, flush policy ``sync`` by default),
then runs two phases against the leader's ``/propose``:

1. **max**: ``--inflight`` concurrent proposals of ``--entry-bytes`` for
   ``--seconds``: committed entries/s, MB/s, commit latency p50/p99;
2. **half rate**: an open-loop load at half the max rate: latency p50/p99.

Latency is the client-side time from sending a proposal to its commit answer.
Prints a table and writes JSON (``--out``). Usage: ``scripts/bench-log --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from raftmq.bench_breakdown import breakdown_rows, breakdown_table, read_stages
from raftmq.local_group import LocalGroup

__all__ = ["main"]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Target:
    """The leader's propose URL; follows NOT_LEADER answers to the new leader."""

    def __init__(self, url: str, http_of_raft: dict[str, str]) -> None:
        self.url = url
        self.http_of_raft = http_of_raft
        self.leader_changes = 0

    def redirect(self, body: bytes) -> None:
        hint = json.loads(body or b"{}").get("leader_address")
        if hint in self.http_of_raft:
            self.url = f"http://{self.http_of_raft[hint]}/propose"
            self.leader_changes += 1


async def _propose(session: aiohttp.ClientSession, target: _Target, payload: bytes,
                   latencies: list[float]) -> bool:
    t0 = time.perf_counter()
    async with session.post(target.url, data=payload) as resp:
        body = await resp.read()
        ok = resp.status == 200
    if ok:
        latencies.append(time.perf_counter() - t0)
    elif resp.status == 421:
        target.redirect(body)
    return ok


async def _closed_loop(url: _Target, payload: bytes, inflight: int, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            if not await _propose(session, url, payload, latencies):
                errors += 1

    connector = aiohttp.TCPConnector(limit=inflight)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(inflight)))
        elapsed = time.perf_counter() - start
    return _summary(latencies, errors, elapsed, len(payload))


async def _open_loop(url: _Target, payload: bytes, rate: float, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    tasks: set[asyncio.Task[bool]] = set()
    connector = aiohttp.TCPConnector(limit=512)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        sent = 0
        while (now := time.perf_counter()) - start < seconds:
            due = int((now - start) * rate) + 1
            while sent < due:
                task = asyncio.create_task(_propose(session, url, payload, latencies))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                sent += 1
            await asyncio.sleep(0.001)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        errors = sum(1 for r in results if r is not True)
        elapsed = time.perf_counter() - start
    summary = _summary(latencies, errors, elapsed, len(payload))
    summary["target_rate"] = rate
    return summary


def _summary(latencies: list[float], errors: int, elapsed: float, size: int) -> dict[str, Any]:
    n = len(latencies)
    return {
        "committed": n,
        "errors": errors,
        "seconds": round(elapsed, 2),
        "entries_per_s": round(n / elapsed, 1),
        "mb_per_s": round(n * size / elapsed / 1e6, 2),
        "latency_ms_p50": round(_percentile(latencies, 0.50) * 1000, 2),
        "latency_ms_p99": round(_percentile(latencies, 0.99) * 1000, 2),
        "latency_ms_mean": round(statistics.fmean(latencies) * 1000, 2) if latencies else None,
    }


def _machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="raftmq-bench-"))
    payload = os.urandom(args.entry_bytes)
    with LocalGroup(base, args.nodes, raft={"flush": args.flush}, log_level="WARNING") as group:
        group.start()
        leader = group.wait_leader(timeout=30)
        url = _Target(f"http://{group.nodes[leader].http}/propose",
                      {n.raft: n.http for n in group.nodes.values()})
        print(f"group up under {base}; leader {leader}; warming up", flush=True)
        asyncio.run(_closed_loop(url, payload, args.inflight, 2.0))
        print(f"phase 1: {args.inflight} in flight x {args.entry_bytes} B for {args.seconds}s",
              flush=True)
        before = read_stages(group) if args.breakdown else {}
        peak = asyncio.run(_closed_loop(url, payload, args.inflight, args.seconds))
        print(f"  {peak}", flush=True)
        if args.breakdown:
            peak["breakdown"] = breakdown_rows(before, read_stages(group), leader,
                                               peak["latency_ms_mean"])
        half = peak["entries_per_s"] / 2
        print(f"phase 2: open loop at {half:.0f} entries/s for {args.seconds}s", flush=True)
        at_half = asyncio.run(_open_loop(url, payload, half, args.seconds))
        print(f"  {at_half}", flush=True)
        target = group.status(leader)["commit_index"]
        statuses = {name: group.wait_status(name, lambda s: s["commit_index"] >= target, 30,
                                            f"commit of {target}") for name in group.nodes}
    identical = len({s["write_position"] for s in statuses.values()}) == 1
    return {
        "command": "scripts/bench-log " + " ".join(args.argv),
        "machine": _machine(),
        "nodes": args.nodes, "flush": args.flush, "entry_bytes": args.entry_bytes,
        "inflight": args.inflight, "max": peak, "half_rate": at_half,
        "replicas_same_write_position": identical, "leader": leader,
        "leader_changes": url.leader_changes,
    }


DESCRIPTION = "Benchmark a local RaftMQ CommitLog group (3 processes on 127.0.0.1)."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench-log", description=DESCRIPTION)
    configure(parser)
    args = parser.parse_args(argv)
    args.argv = argv if argv is not None else sys.argv[1:]
    return run_command(args)


def configure(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``raftmq bench-log`` (``scripts/bench-log``)."""
    parser.add_argument("--entry-bytes", type=int, default=30 * 1024,
                        help="payload bytes per entry (default 30 KiB)")
    parser.add_argument("--inflight", type=int, default=32, help="concurrent proposals")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--flush", choices=["sync", "async"], default="sync")
    parser.add_argument("--dir", help="group directory (default: a new temp dir)")
    parser.add_argument("--out", default="bench-out/bench-log.json", help="JSON result file")
    parser.add_argument("--breakdown", action="store_true",
                        help="also print where phase 1's commit time goes, stage by stage "
                             "(every replica's /stages; dledger/stage_clock.py)")


def run_command(args: argparse.Namespace) -> int:
    if not hasattr(args, "argv"):
        args.argv = sys.argv[2:]  # under `raftmq bench-log`
    result = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    m, h = result["max"], result["half_rate"]
    print(f"\n| phase | entries/s | MB/s | p50 ms | p99 ms | errors |\n|---|---|---|---|---|---|\n"
          f"| max ({args.inflight} in flight) | {m['entries_per_s']} | {m['mb_per_s']} | "
          f"{m['latency_ms_p50']} | {m['latency_ms_p99']} | {m['errors']} |\n"
          f"| half rate | {h['entries_per_s']} | {h['mb_per_s']} | {h['latency_ms_p50']} | "
          f"{h['latency_ms_p99']} | {h['errors']} |\nwritten to {out}")
    if "breakdown" in m:
        print(f"\nphase 1, stage by stage (leader {result['leader']}):\n{breakdown_table(m['breakdown'])}")
    return 0
