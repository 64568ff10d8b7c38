"""The name server: which groups serve a topic, and who leads each group.

Every broker replica registers itself (``POST /register``) every 30 s and at once when
its role, term, members or topics change; a registration expires 120 s after it was last
renewed. Clients ask ``GET /route/{topic}`` (no key needed: routes are read-only)::

    {"topic": "orders",
     "groups": [{"group": "g1", "queues": 8, "perm": 6,
                 "leader": "127.0.0.1:10911" | null,
                 "replicas": {"n1": "127.0.0.1:10911", "n2": ..., "n3": ...}}]}

A registration is signed with its group's registration key (``broker.security.registration_auth``:
HMAC over the body with a timestamp and a nonce; replays refused) and must agree with
what the table holds for the group (``broker.namesrv.route_table``: terms, members). Its body::

    {"group": "g1", "node": "n1", "role": "leader", "term": 7, "address": "10.0.0.11:10911",
     "members": ["n1", "n2", "n3"],
     "topics": {"kind": "delta", "base": "9f3a:4", "version": "9f3a:5",
                "set": {"orders": [8, 6]}, "removed": ["old"]}
            |  {"kind": "full", "version": "9f3a:6", "page": 0, "pages": 3, "set": {...}}}

Answers: 200 ``{"ok": true, "held": VERSION}``; 400 a malformed body; 401 not
authenticated (unknown group, bad or missing signature, stale timestamp, replay); 403
refused by the group's state (a lower term, a non-member, a body for another group);
409 ``{"resync": true}``: the topic change does not apply to what is held, send the
whole table in pages; 413 a body over 1 MiB. Refusals are logged, at most once a minute
per reason with a count.

Name servers keep no state on disk and do not talk to each other: run several and
register every broker with each, as RocketMQ does.

Usage: ``raftmq namesrv --config namesrv.toml`` (``broker.namesrv.config``; ``[namesrv.tls]``
serves https, ``broker.security.tls``). Without groups, or on an address other hosts reach without
TLS (``broker.security.exposure``), it refuses to start unless ``--insecure`` (for a throw-away
test; warned at every start). ``raftmq namesrv-key`` writes a group's key.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import ssl
import sys
from pathlib import Path
from typing import Literal

import msgspec
from aiohttp import web

from broker.namesrv.config import read_namesrv_config
from broker.namesrv.route_table import (
    EXPIRY_S,
    Refused,
    Registration,
    Resync,
    RouteTable,
    TopicDelta,
    TopicPage,
)
from broker.rocketmq.namesrv_front import NameServerFrontEnd
from broker.security.exposure import check_exposure
from broker.security.registration_auth import AuthError, RegistrationVerifier, registration_key
from broker.security.tls import server_context
from common.process import configure_logging, control_app, run_alone
from common.protocol_sniffer import ProtocolSniffer
from common.refusal_log import RefusalLog
from common.toml_config import ConfigError
from dledger.config import load_group_config
from protocol.tls import http_url

__all__ = ["EXPIRY_S", "MAX_REQUEST_BYTES", "REGISTER_EVERY_S", "Registration", "RouteTable", "main",
           "make_app"]

log = logging.getLogger("broker.namesrv")

REGISTER_EVERY_S = 30.0
MAX_REQUEST_BYTES = 1 << 20


class _TopicsDoc(msgspec.Struct, forbid_unknown_fields=True):
    kind: Literal["delta", "full"]
    version: str
    base: str = ""
    page: int = 0
    pages: int = 1
    set: dict[str, tuple[int, int]] = msgspec.field(default_factory=dict)
    removed: list[str] = msgspec.field(default_factory=list)


class _RegistrationDoc(msgspec.Struct, forbid_unknown_fields=True):
    group: str
    node: str
    role: str
    address: str
    term: int = 0
    members: list[str] | None = None
    topics: _TopicsDoc | None = None


def parse_registration(body: bytes) -> tuple[Registration, TopicDelta | TopicPage | None]:
    """A registration body (module docstring); ValueError saying what is wrong."""
    try:
        doc = msgspec.json.decode(body, type=_RegistrationDoc)
    except msgspec.DecodeError as e:  # ValidationError too
        raise ValueError(str(e)) from None
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if not all((doc.group, doc.node, doc.role, doc.address)):
        raise ValueError("group, node, role and address must be non-empty")
    reg = Registration(doc.group, doc.node, doc.role, doc.address, None, doc.term,
                       None if doc.members is None else tuple(doc.members))
    t = doc.topics
    if t is None:
        return reg, None
    if t.kind == "delta":
        return reg, TopicDelta(t.base, t.version, t.set, tuple(t.removed))
    if not 0 <= t.page < t.pages:
        raise ValueError(f"page {t.page} of {t.pages}")
    return reg, TopicPage(t.version, t.page, t.pages, t.set)


def _refuse(refusals: RefusalLog, request: web.Request, status: int, reason: str,
            message: str) -> web.Response:
    refusals.note(f"{status} {reason}", request.remote, f"({status} {reason}) {message}")
    return web.json_response({"error": message, "reason": reason}, status=status)


def make_app(table: RouteTable, verifier: RegistrationVerifier | None = None) -> web.Application:
    """The name server's HTTP app; ``verifier`` None: registrations are not authenticated
    (``--insecure``)."""
    refusals = RefusalLog(log, "refused a registration from")

    async def register(request: web.Request) -> web.Response:
        body = await request.read()
        group = None
        if verifier is not None:
            try:
                group = verifier.verify(request.headers, body)
            except AuthError as e:
                return _refuse(refusals, request, e.status, e.reason, str(e))
        try:
            reg, change = parse_registration(body)
        except ValueError as e:
            return web.json_response({"error": f"malformed registration: {e}"}, status=400)
        if group is not None and reg.group != group:
            return _refuse(refusals, request, 403, "other group",
                           f"signed for group {group!r}, registers group {reg.group!r}")
        try:
            table.register(reg)
            held = "" if change is None else table.sync_topics(reg.group, reg.node, change)
        except Refused as e:
            return _refuse(refusals, request, 403, e.reason, str(e))
        except Resync as e:
            return web.json_response({"error": str(e), "resync": True}, status=409)
        return web.json_response({"ok": True, "held": held, "register_every_s": REGISTER_EVERY_S})

    async def route(request: web.Request) -> web.Response:
        found = table.route(request.match_info["topic"])
        return web.json_response(msgspec.to_builtins(found), status=200 if found.groups else 404)

    async def cluster(request: web.Request) -> web.Response:
        return web.json_response(table.cluster())

    return control_app([web.post("/register", register), web.get("/route/{topic}", route),
                        web.get("/cluster", cluster)], max_body=MAX_REQUEST_BYTES)


DESCRIPTION = "Run a RaftMQ name server (routes of topics)."
KEY_DESCRIPTION = ("Print or write a group's name-server registration key, derived from the group's "
                   "Raft secret (give the name server this key, never the secret).")


def configure(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``raftmq namesrv`` (also ``python -m broker.namesrv.server``)."""
    parser.add_argument("--config", type=Path, help="the name server's TOML: listen address, groups and "
                                                    "their key files (broker/namesrv/config.py)")
    parser.add_argument("--listen", help="HOST:PORT (default: the config's, else 127.0.0.1:9876)")
    parser.add_argument("--insecure", action="store_true",
                        help="start anyway without groups (registrations then unsigned) or without TLS on "
                             "an address other hosts reach; logged as a WARNING (throw-away tests)")
    parser.add_argument("--log-level", default="INFO")


def main(argv: list[str] | None = None) -> int:
    return run_alone(argv, "raftmq namesrv", DESCRIPTION, configure, run)


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    try:
        config = read_namesrv_config(args.config) if args.config else None
        listen = args.listen or (config.listen if config else "127.0.0.1:9876")
        tls = config.tls if config is not None else None
        ssl_context = server_context(tls, "namesrv.tls") if tls is not None else None
        check_exposure("the name server", listen, tls=tls is not None, acl=None, insecure=args.insecure,
                       how="[namesrv.tls] (docs/SECURITY.md)", log=log)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    verifier = None
    if config is not None and config.keys:
        verifier = RegistrationVerifier(config.keys, skew_s=config.clock_skew_s)
        log.info("serving groups %s; registrations must be signed with their keys",
                 ", ".join(verifier.groups))
    elif args.insecure:
        log.warning("INSECURE: registrations are not authenticated: anyone who reaches %s can change "
                    "the routes (use --config with the groups' keys)", listen)
    else:
        print("error: no groups to serve: give --config naming [groups.NAME] key_file = ... (write keys "
              "with `raftmq namesrv-key`), or --insecure for a throw-away test", file=sys.stderr)
        return 2
    asyncio.run(_serve(listen, make_app(table := RouteTable(), verifier), NameServerFrontEnd(table),
                       ssl_context))
    return 0


async def _serve(listen: str, app: web.Application, rocketmq: NameServerFrontEnd,
                 ssl_context: ssl.SSLContext | None) -> None:
    """Serve ``app`` (HTTP) and RocketMQ's name-server codes on one port -- a connection's first
    byte says which (``common.protocol_sniffer``) -- until SIGTERM or SIGINT."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, port = listen.rsplit(":", 1)
    loop = asyncio.get_running_loop()
    http = runner.server
    assert http is not None
    listening = await loop.create_server(lambda: ProtocolSniffer(http, rocketmq.protocol), host, int(port),
                                         ssl=ssl_context, reuse_address=True)
    log.info("name server on %s (RocketMQ clients: the same address)",
             http_url(listen, "", ssl_context is not None))
    stop = asyncio.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    try:
        await stop.wait()
    finally:
        listening.close()
        await runner.cleanup()


def configure_key(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``raftmq namesrv-key``."""
    parser.add_argument("--config", type=Path, help="a replica's TOML: its group name and secret")
    parser.add_argument("--group", help="the group's name (with --secret-file)")
    parser.add_argument("--secret-file", type=Path, help="the group's Raft secret (with --group)")
    parser.add_argument("--out", type=Path, help="write the key here (mode 0600) instead of printing it")


def run_key(args: argparse.Namespace) -> int:
    try:
        if args.config:
            config = load_group_config(args.config, other_sections=("broker",))
            group, secret = config.group, config.secret
        elif args.group and args.secret_file:
            group, secret = args.group, args.secret_file.read_text().strip()
        else:
            print("error: give --config REPLICA_TOML, or --group G --secret-file F", file=sys.stderr)
            return 2
    except (ConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not secret:
        print(f"error: group {group!r} has no secret to derive a key from", file=sys.stderr)
        return 2
    key = registration_key(secret, group).hex()
    if args.out is None:
        print(key)
        return 0
    write_key_file(args.out, key)
    print(f"wrote the registration key of group {group!r} to {args.out}")
    return 0


def write_key_file(path: Path, key_hex: str) -> None:
    """Write a key file readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key_hex + "\n")
    path.chmod(0o600)


if __name__ == "__main__":
    sys.exit(main())
