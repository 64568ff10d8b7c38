"""``python -m benchmarks.namesrv``: what registering and routing N topics costs.

Starts a real name server process (``raftmq namesrv --config``, one group) and registers
the replicas n1..nR of that group with N topics of 127-character names, through the
broker's own ``Registrar`` (signed, paged); then measures a one-topic change, a renewal,
and route lookups over HTTP and in the table alone. Prints one JSON document: wall
times, the name server's CPU time and resident memory, bytes and requests sent.

    python -m benchmarks.namesrv --topics 100000 --replicas 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from broker.namesrv.config import write_namesrv_config
from broker.namesrv.route_table import Registration, RouteTable
from broker.namesrv.server import write_key_file
from broker.registrar import Registrar, topic_pages
from broker.security.registration_auth import registration_key

__all__ = ["main"]


@dataclass(frozen=True, slots=True)
class _Topic:
    queues: int
    perm: int


@dataclass
class _Config:
    node: str
    group: str = "g1"
    secret: str = ""


@dataclass
class _Replica:
    """The surface of a replica's log the registrar reads, standing still."""

    config: _Config
    role: str
    names: list[str] = field(default_factory=list)

    def status(self) -> dict[str, Any]:
        return {"role": self.role, "term": 1, "member": True}

    def members(self) -> dict[str, None]:
        return dict.fromkeys(self.names)


@dataclass
class _Machine:
    topics: dict[str, _Topic]


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime in clock ticks (100/s)


def _proc_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _wait_up(session: aiohttp.ClientSession, address: str) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            async with session.get(f"http://{address}/healthz") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)


async def _measure(address: str, pid: int, secret: str, n_topics: int, n_replicas: int,
                   lookups: int) -> dict[str, Any]:
    names = [f"t{i:06d}-".ljust(127, "x") for i in range(n_topics)]
    machine = _Machine({t: _Topic(8, 6) for t in names})
    nodes = [f"n{i + 1}" for i in range(n_replicas)]
    registrars = [Registrar(_Replica(_Config(n, secret=secret), "leader" if i == 0 else "follower", nodes),
                            machine, f"127.0.0.1:{10911 + i}", [address]) for i, n in enumerate(nodes)]
    out: dict[str, Any] = {"topics": n_topics, "replicas": n_replicas}
    async with aiohttp.ClientSession() as session:
        await _wait_up(session, address)
        out["namesrv_rss_mib_idle"] = round(_proc_rss_mib(pid), 1)
        cpu0, t0 = _proc_cpu_s(pid), time.perf_counter()
        for r in registrars:
            await r.register_once(session)
        out["full_registration_s_per_replica"] = round((time.perf_counter() - t0) / n_replicas, 3)
        out["namesrv_cpu_s_per_full_registration"] = round((_proc_cpu_s(pid) - cpu0) / n_replicas, 3)
        out["namesrv_rss_mib_loaded"] = round(_proc_rss_mib(pid), 1)
        polls = []
        for _ in range(7):  # nothing changed, nothing due: the cost of looking every 0.5 s
            t0 = time.perf_counter()
            await registrars[0].register_once(session)
            polls.append(time.perf_counter() - t0)
        out["idle_poll_ms_median"] = round(sorted(polls)[3] * 1000, 2)
        out["pages_per_full_registration"] = len(list(topic_pages(sorted(machine.topics.items()))))
        deltas = []
        for k in range(7):  # one topic more each time: a delta, the median of 7
            machine.topics = {**machine.topics, f"one-more-{k}": _Topic(4, 6)}
            t0 = time.perf_counter()
            await registrars[0].register_once(session)
            deltas.append(time.perf_counter() - t0)
        out["one_topic_delta_ms_median"] = round(sorted(deltas)[3] * 1000, 2)
        out["one_topic_delta_ms_max"] = round(max(deltas) * 1000, 2)
        rng = random.Random(1)
        t0 = time.perf_counter()
        for _ in range(lookups):
            async with session.get(f"http://{address}/route/{rng.choice(names)}") as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
        out["route_lookup_http_ms"] = round((time.perf_counter() - t0) * 1000 / lookups, 3)
    return out


def _table_lookup_us(n_topics: int, n_replicas: int, lookups: int) -> float:
    table = RouteTable()
    topics = {f"t{i:06d}-".ljust(127, "x"): (8, 6) for i in range(n_topics)}
    nodes = tuple(f"n{i + 1}" for i in range(n_replicas))
    for i, node in enumerate(nodes):
        role = "leader" if i == 0 else "follower"
        table.register(Registration("g1", node, role, f"h:{i}", topics, 1, nodes))
    names = list(topics)
    t0 = time.perf_counter()
    for i in range(lookups):
        table.route(names[(i * 7919) % n_topics])
    return (time.perf_counter() - t0) * 1e6 / lookups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.namesrv", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--port", type=int, default=19876)
    args = parser.parse_args(argv)
    secret = secrets.token_urlsafe(32)  # the group's: the registrars derive its key too
    address = f"127.0.0.1:{args.port}"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_key_file(root / "g1.key", registration_key(secret, "g1").hex())
        config = write_namesrv_config(root / "namesrv.toml", address, {"g1": Path("g1.key")})
        proc = subprocess.Popen([sys.executable, "-m", "broker.namesrv.server", "--config", str(config),
                                 "--log-level", "WARNING"])
        try:
            result = asyncio.run(_measure(address, proc.pid, secret, args.topics, args.replicas,
                                          args.lookups))
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    result["route_lookup_table_us"] = round(_table_lookup_us(args.topics, args.replicas, args.lookups), 2)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
