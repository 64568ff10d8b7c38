"""The name server: which groups serve a topic, and who leads each group.

Every broker replica registers itself every 30 s (``POST /register``) with its
group, node name, role, client address and the topics it holds; a registration
expires 120 s after it was last renewed. Clients ask ``GET /route/{topic}``:

    {"topic": "orders",
     "groups": [{"group": "g1", "queues": 8, "perm": 6,
                 "leader": "127.0.0.1:10911" | null,
                 "replicas": {"n1": "127.0.0.1:10911", "n2": ..., "n3": ...}}]}

A registration also names the group's members as the replica's log says
(``members``); the route lists only the replicas the newest leader counts as
members, so a replica removed with ``raftmq replica remove`` drops out of routes
at once and a new one appears with its first registration.

A topic's queues can span several groups (each group has its own queues).
Name servers keep no state on disk and do not talk to each other: run several and
register every broker with each, as RocketMQ does.

Usage: ``raftmq namesrv --listen 127.0.0.1:9876``
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

from protocol.topic import GroupRouteData, TopicRouteData

__all__ = ["EXPIRY_S", "REGISTER_EVERY_S", "Registration", "RouteTable", "main", "make_app"]

log = logging.getLogger("broker.namesrv")

REGISTER_EVERY_S = 30.0
EXPIRY_S = 120.0


@dataclass(frozen=True, slots=True)
class Registration:
    group: str
    node: str
    role: str
    address: str
    topics: dict[str, tuple[int, int]] = field(default_factory=dict)  # topic -> (queues, perm)
    term: int = 0
    members: tuple[str, ...] | None = None  # the group's member names, as this replica knows them


class RouteTable:
    """Registrations by (group, node), each with the time it was last renewed."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, expiry_s: float = EXPIRY_S) -> None:
        self._clock = clock
        self._expiry = expiry_s
        self._entries: dict[tuple[str, str], tuple[Registration, float]] = {}

    def register(self, reg: Registration) -> None:
        self._entries[(reg.group, reg.node)] = (reg, self._clock())

    def live(self) -> list[Registration]:
        now = self._clock()
        for key in [k for k, (_, at) in self._entries.items() if now - at > self._expiry]:
            reg = self._entries.pop(key)[0]
            log.info("registration of %s/%s expired", reg.group, reg.node)
        return [reg for reg, _ in self._entries.values()]

    def route(self, topic: str) -> TopicRouteData:
        """Groups holding ``topic``; a group's leader is the leader-role registration with
        the highest term (a dead leader's registration lingers until it expires)."""
        by_group: dict[str, list[Registration]] = {}
        for reg in sorted(self.live(), key=lambda r: (r.group, r.node)):
            by_group.setdefault(reg.group, []).append(reg)
        groups = [_group_route(topic, group, regs) for group, regs in by_group.items()]
        return TopicRouteData(topic, tuple(g for g in groups if g.queues > 0))

    def cluster(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for reg in sorted(self.live(), key=lambda r: (r.group, r.node)):
            out.setdefault(reg.group, {})[reg.node] = {"role": reg.role, "address": reg.address,
                                                       "topics": sorted(reg.topics)}
        return out


def _group_route(topic: str, group: str, regs: list[Registration]) -> GroupRouteData:
    """One group's part of ``topic``'s route from its replicas' registrations (by node)."""
    leader: Registration | None = None
    members: tuple[str, ...] | None = None  # as the newest leader that named them says
    queues = perm = 0
    for reg in regs:
        if reg.role == "leader" and reg.term >= (leader.term if leader is not None else -1):
            leader = reg
            members = reg.members if reg.members is not None else members
        if topic in reg.topics:
            queues, perm = max(queues, reg.topics[topic][0]), reg.topics[topic][1]
    replicas = {r.node: r.address for r in regs if members is None or r.node in members}
    return GroupRouteData(group=group, queues=queues, perm=perm,
                          leader=leader.address if leader is not None else None, replicas=replicas)


def _parse_registration(doc: Any) -> Registration:
    if not isinstance(doc, dict):
        raise ValueError("a JSON object")
    fields = {k: doc.get(k) for k in ("group", "node", "role", "address")}
    if not all(isinstance(v, str) and v for v in fields.values()):
        raise ValueError("group, node, role and address as non-empty strings")
    topics = doc.get("topics", {})
    if not isinstance(topics, dict) or not all(
            isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v)
            for v in topics.values()):
        raise ValueError("topics as {name: [queues, perm]}")
    term = doc.get("term", 0)
    if not isinstance(term, int):
        raise ValueError("term as an integer")
    members = doc.get("members")
    if members is not None and not (isinstance(members, list) and all(isinstance(m, str) for m in members)):
        raise ValueError("members as a list of node names")
    return Registration(**fields, topics={t: (v[0], v[1]) for t, v in topics.items()}, term=term,
                        members=None if members is None else tuple(members))


def make_app(table: RouteTable) -> web.Application:
    async def register(request: web.Request) -> web.Response:
        try:
            reg = _parse_registration(await request.json())
        except ValueError as e:
            return web.json_response({"error": f"registration must be {e}"}, status=400)
        table.register(reg)
        return web.json_response({"ok": True, "register_every_s": REGISTER_EVERY_S})

    async def route(request: web.Request) -> web.Response:
        found = table.route(request.match_info["topic"])
        return web.json_response(msgspec.to_builtins(found), status=200 if found.groups else 404)

    async def cluster(request: web.Request) -> web.Response:
        return web.json_response(table.cluster())

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=1 << 20)
    app.add_routes([web.post("/register", register), web.get("/route/{topic}", route),
                    web.get("/cluster", cluster), web.get("/healthz", healthz)])
    return app


DESCRIPTION = "Run a RaftMQ name server (routes of topics)."


def configure(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``raftmq namesrv`` (also ``python -m broker.namesrv``)."""
    parser.add_argument("--listen", default="127.0.0.1:9876", help="HOST:PORT (default 127.0.0.1:9876)")
    parser.add_argument("--log-level", default="INFO")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raftmq namesrv", description=DESCRIPTION)
    configure(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, port = args.listen.rsplit(":", 1)
    web.run_app(make_app(RouteTable()), host=host, port=int(port), access_log=None,
                print=lambda *_: log.info("name server on http://%s", args.listen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
