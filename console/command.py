"""``raftmq console [--namesrv H:P | --dir D] [--ca-file PEM ...] [--listen 127.0.0.1:8080]
[--listen-cert-file PEM --listen-key-file PEM] [--insecure]``: serve the web console until
SIGINT/SIGTERM. Prints ``console at http(s)://HOST:PORT/`` once listening (``--listen
127.0.0.1:0`` picks a free port).

Two sides of TLS:
- the cluster it reads (a cluster serving TLS): the CLI's TLS flags (``--ca-file``, and
  ``--cert-file``/``--key-file``: the console's *client* certificate under mutual TLS), else
  the CA a ``--dir``'s cluster.json names, else ``$RAFTMQ_CA_FILE`` & co.
  (``client.cli.cli_tls``);
- its own page: https with ``--listen-cert-file``/``--listen-key-file`` (TLS 1.2+). A
  password typed at sign-in crosses the network, so off loopback the console refuses to
  start without them (an ``error:`` line, exit 2) unless ``--insecure``, which logs a
  WARNING at every start (``protocol.exposure``).

Off loopback it also refuses to front a cluster without ACLs (the replicas answer an
anonymous admin read): anyone reaching the page would act as an anonymous admin. It asks
the cluster at start (for up to 10 s); ``--insecure`` waives this too, with a WARNING. Off
loopback without ``--insecure`` its API serves signed-in users only (whatever the cluster
said at start: its ACLs could be switched off later)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import ssl
import sys
from pathlib import Path

from aiohttp import web

from client.aio.routes import default_namesrv
from client.cli_cluster import add_tls_arguments, cli_tls
from console.gateway import ClusterGateway
from console.web import Console
from protocol.exposure import check_exposure, is_loopback
from protocol.tls import ClientTls, listening_context

__all__ = ["DESCRIPTION", "configure", "main", "run", "serving_context"]

log = logging.getLogger("raftmq.console")

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
    page = parser.add_argument_group("the console's own page over https (needed off loopback)")
    page.add_argument("--listen-cert-file", metavar="PEM", help="the console's server certificate (chain)")
    page.add_argument("--listen-key-file", metavar="PEM", help="its private key")
    page.add_argument("--insecure", action="store_true",
                      help="serve plain HTTP off loopback anyway (sign-in passwords in clear; a WARNING)")
    add_tls_arguments(parser)


def serving_context(cert_file: str | None, key_file: str | None) -> ssl.SSLContext | None:
    """The page's TLS (``protocol.tls.listening_context``), or None without a certificate;
    ValueError when only one of the two files is given or they cannot be used."""
    if not cert_file and not key_file:
        return None
    if not (cert_file and key_file):
        raise ValueError("--listen-cert-file and --listen-key-file go together")
    try:
        return listening_context(cert_file, key_file)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"cannot use --listen-cert-file {cert_file} with --listen-key-file {key_file}: "
                         f"{e}") from e


def where_of(args: argparse.Namespace) -> tuple[list[str], ClientTls | bool | None]:
    """The name servers and the client's ``tls=`` (module docstring)."""
    if args.namesrv:
        return list(args.namesrv), cli_tls(args)
    if args.dir:
        state = json.loads((Path(args.dir) / "cluster.json").read_text())
        return [state["namesrv"]["address"]], cli_tls(args, state)
    return default_namesrv(), cli_tls(args)


async def serve(args: argparse.Namespace, context: ssl.SSLContext | None, sign_in_only: bool = False) -> None:
    host, _, port = args.listen.rpartition(":")
    namesrv, tls = where_of(args)
    console = Console(namesrv, args.sample_interval, tls, sign_in_only=sign_in_only)
    runner = web.AppRunner(console.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, int(port), ssl_context=context)
    await site.start()
    bound = runner.addresses[0][1]  # the port bound (for port 0: the one chosen)
    scheme = "https" if context is not None else "http"
    print(f"console at {scheme}://{host}:{bound}/ (name servers {', '.join(console.namesrv)})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


async def cluster_acl(namesrv: list[str], tls: ClientTls | bool | None,
                      within_s: float = 10.0) -> bool | None:
    """Whether the cluster checks users (``ClusterGateway.acl_enforced``), asked for up to
    ``within_s`` while nothing answers."""
    gateway = ClusterGateway(namesrv, None, tls)
    try:
        deadline = asyncio.get_running_loop().time() + within_s
        while True:
            found = await gateway.acl_enforced()
            if found is not None or asyncio.get_running_loop().time() > deadline:
                return found
            await asyncio.sleep(0.5)
    finally:
        await gateway.close()


def check_cluster_acl(args: argparse.Namespace) -> bool:
    """Whether the console must act only for signed-in users: it listens off loopback and
    not ``--insecure``. ValueError when it would listen there in front of a cluster known
    to have no ACLs (a WARNING with ``--insecure``)."""
    if is_loopback(args.listen.rpartition(":")[0]):
        return False
    namesrv, tls = where_of(args)
    acl = asyncio.run(cluster_acl(namesrv, tls))
    if acl is None:
        log.warning("cannot ask the cluster whether it checks users (no answer from %s): the console "
                    "acts only for signed-in users", ", ".join(namesrv))
    if acl is not False:
        return not args.insecure
    if not args.insecure:
        raise ValueError(f"the console listens on {args.listen}, which other hosts can reach, in front of a "
                         "cluster without ACLs: anyone reaching the page would act as an anonymous admin; "
                         "turn on [broker] acl = true on the brokers (docs/SECURITY.md), listen on "
                         "127.0.0.1, or pass --insecure")
    log.warning("INSECURE (--insecure): the console listens on %s in front of a cluster without ACLs: "
                "anyone who reaches it acts as an anonymous admin", args.listen)
    return False


def run(args: argparse.Namespace) -> int:
    try:
        context = serving_context(args.listen_cert_file, args.listen_key_file)
        check_exposure("the console", args.listen, tls=context is not None, acl=None, insecure=args.insecure,
                       how="--listen-cert-file and --listen-key-file", log=log)
        sign_in_only = check_cluster_acl(args)
    except ValueError as e:  # ExposureRefused too
        print(f"error: {e}", file=sys.stderr)
        return 2
    asyncio.run(serve(args, context, sign_in_only))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raftmq console", description=DESCRIPTION)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
