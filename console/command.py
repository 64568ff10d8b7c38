"""``raftmq console [--namesrv H:P | --dir D] [--ca-file PEM ...] [--listen 127.0.0.1:8080]``:
serve the web console until SIGINT/SIGTERM. Prints ``console at http://HOST:PORT/`` once
listening (``--listen 127.0.0.1:0`` picks a free port). A cluster serving TLS: the CLI's
TLS flags, else the CA a ``--dir``'s cluster.json names, else ``$RAFTMQ_CA_FILE`` & co.
(``client.cli.cli_tls``). The console itself serves plain HTTP: keep it on loopback."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from aiohttp import web

from client.aio.routes import default_namesrv
from client.cli import add_tls_arguments, cli_tls
from console.web import Console
from protocol.tls import ClientTls

__all__ = ["DESCRIPTION", "configure", "main", "run"]

DESCRIPTION = ("Serve the RaftMQ web console: cluster, topics, consumer groups, messages, dead letters "
               "and live charts, over the client and admin API (no CDN: the assets are in the package).")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namesrv", action="append", metavar="HOST:PORT",
                        help="a name server (repeatable; default $RAFTMQ_NAMESRV, else 127.0.0.1:9876)")
    parser.add_argument("--dir", help="a local cluster's directory (its cluster.json names the name server)")
    parser.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT",
                        help="where to serve (default 127.0.0.1:8080; port 0: any free port)")
    parser.add_argument("--sample-interval", type=float, default=1.0, metavar="S",
                        help="seconds between samples of /status and /metrics (default 1)")
    add_tls_arguments(parser)


def where_of(args: argparse.Namespace) -> tuple[list[str], ClientTls | bool | None]:
    """The name servers and the client's ``tls=`` (module docstring)."""
    if args.namesrv:
        return list(args.namesrv), cli_tls(args)
    if args.dir:
        state = json.loads((Path(args.dir) / "cluster.json").read_text())
        return [state["namesrv"]["address"]], cli_tls(args, state)
    return default_namesrv(), cli_tls(args)


async def serve(args: argparse.Namespace) -> None:
    host, _, port = args.listen.rpartition(":")
    namesrv, tls = where_of(args)
    console = Console(namesrv, args.sample_interval, tls)
    runner = web.AppRunner(console.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, int(port))
    await site.start()
    bound = runner.addresses[0][1]  # the port bound (for port 0: the one chosen)
    print(f"console at http://{host}:{bound}/ (name servers {', '.join(console.namesrv)})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def run(args: argparse.Namespace) -> int:
    asyncio.run(serve(args))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raftmq console", description=DESCRIPTION)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
