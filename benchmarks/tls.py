"""``python -m benchmarks.tls``: the CPU TLS adds to one request/response over a WebSocket.

A client and an echo server in one process (aiohttp, as the client and the broker use it)
exchange ``--rounds`` frames of ``--size`` bytes, one at a time, plain and then over TLS
(certificates of a throw-away local CA), ``--repeat`` times interleaved after one discarded
plain run; the process's CPU time per round trip (both ends) is printed, and the least of
each (on a shared box CPU time per operation grows when the other cores are busy). End-to-end
figures: ``raftmq bench produce --local [--tls]`` (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from broker.security.tls import server_context
from protocol.tls import ws_url
from raftmq.local_group import free_port
from raftmq.local_tls import LocalCA

__all__ = ["main"]


async def _echo(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    async for msg in ws:
        await ws.send_bytes(msg.data)
    return ws


async def cpu_per_round_trip(ca: LocalCA | None, rounds: int, size: int) -> float:
    """Microseconds of this process's CPU per frame sent and echoed (``ca``: over TLS)."""
    app = web.Application()
    app.add_routes([web.get("/ws", _echo)])
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    context = server_context(ca.server_tls(), "bench") if ca is not None else None
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
    connector = aiohttp.TCPConnector(ssl=ca.client_tls().context() if ca is not None else True)
    body = b"x" * size
    try:
        async with aiohttp.ClientSession(connector=connector) as session:
            ws = await session.ws_connect(ws_url(f"127.0.0.1:{port}", "/ws", ca is not None))
            for _ in range(min(500, rounds)):  # warm up
                await ws.send_bytes(body)
                await ws.receive()
            started = time.process_time()
            for _ in range(rounds):
                await ws.send_bytes(body)
                await ws.receive()
            used = time.process_time() - started
            await ws.close()
    finally:
        await runner.cleanup()
    return used / rounds * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tls", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=400, help="bytes per frame (default 400: one send)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="raftmq-bench-tls-") as d:
        ca = LocalCA(Path(d)).ensure()
        runs: dict[str, list[float]] = {"plain": [], "tls": []}
        asyncio.run(cpu_per_round_trip(None, args.rounds, args.size))  # discarded (warm-up)
        for _ in range(args.repeat):
            runs["plain"].append(asyncio.run(cpu_per_round_trip(None, args.rounds, args.size)))
            runs["tls"].append(asyncio.run(cpu_per_round_trip(ca, args.rounds, args.size)))
    for name, values in runs.items():
        print(f"{name:>5}: {' / '.join(f'{v:.1f}' for v in values)} us of CPU per round trip "
              f"({args.size} B each way, client and server); least {min(values):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
