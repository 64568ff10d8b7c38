"""The admin API for a group's members (``raftmq replica`` is its client).

    GET  /admin/members                       {"members": {name: {raft, client}}, "leader",
                                               "node": the replica that answers,
                                               "changed_at": index of the newest change}
    POST /admin/members  (on the leader)      {"op": "add", "name", "raft", "client"}
                                              {"op": "remove", "name"}

An ``add`` is refused (409, with how far behind) until the new replica -- started
with ``[group] join = true`` -- has caught up as a learner: its *applied* index is
within ``CATCH_UP_SLACK`` entries of the leader's committed index and its apply step is
not waiting for a snapshot, read from its ``/status`` at ``client``. Only then is the
change proposed, so the replica counts for the majority only once it can acknowledge new
entries at once and holds the group's state, not just its log (Raft thesis §4.2.1). A ``remove`` of
the leader itself is refused (409 with ``"leads": true``): transfer the leadership first. Any node that is not
the leader answers 421 naming the leader.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import aiohttp
import msgspec
from aiohttp import web

from common.http_errors import read_json
from dledger.errors import NoLeader, NotLeader, ProposeError
from dledger.membership import Change, Member

if TYPE_CHECKING:
    from broker.http_api.server_view import ServerView

__all__ = ["CATCH_UP_SLACK", "member_routes"]

CATCH_UP_SLACK = 1000  # entries a learner may still be behind when it is added


class _ChangeDoc(msgspec.Struct):
    op: str
    name: str
    raft: str | None = None
    client: str | None = None


def _members_doc(server: ServerView) -> dict[str, Any]:
    rlog = server.rlog
    clients = rlog.client_addresses()
    return {"group": rlog.config.group, "node": rlog.config.node, "leader": rlog.leader,
            "members": {n: {"raft": m.raft, "client": clients.get(n, "")}
                        for n, m in sorted(rlog.members().items())},
            "changed_at": rlog.status().members_changed_at}


async def _learner_lag(server: ServerView, member: Member) -> tuple[int | None, str, str]:
    """(entries behind the leader, why unknown, its storage token) of the replica about to be
    added: the add records that storage (dledger.raft.storage_rule: it counts once committed)."""
    try:
        async with server.http_session().get(server.peer_url(member.client, "/status"),
                                      timeout=aiohttp.ClientTimeout(total=3)) as resp:
            doc = await resp.json()
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        why = f"{member.name}'s broker at {member.client} does not answer ({e or type(e).__name__})"
        return None, why, ""
    if doc.get("group") != server.rlog.config.group or doc.get("node") != member.name:
        return None, (f"{member.client} is replica {doc.get('node')!r} of group {doc.get('group')!r}, "
                      f"not {member.name} of {server.rlog.config.group}"), ""
    if doc.get("apply_stalled"):
        return None, f"{member.name} is still catching up: {doc['apply_stalled']}", ""
    held = min(int(doc.get("commit_index", 0)), int(doc.get("applied_index", 0)))
    storage = doc.get("storage")
    return max(0, server.rlog.committed_index - held), "", storage if isinstance(storage, str) else ""


def member_routes(server: ServerView) -> list[web.RouteDef]:
    async def get_members(request: web.Request) -> web.Response:
        return web.json_response(_members_doc(server))

    async def change_members(request: web.Request) -> web.Response:
        rlog = server.rlog
        doc = await read_json(request, _ChangeDoc)
        op = doc.op
        try:
            if op == "add":
                if doc.raft is None or doc.client is None:
                    raise ValueError("an add names raft and client")
                member = Member(doc.name, doc.raft, doc.client)
            elif op == "remove":
                current = rlog.members().get(doc.name)
                member = current or Member(doc.name, "0.0.0.0:1")
            else:
                raise ValueError(f"op {op!r}")
            member.check()
        except ValueError as e:
            return web.json_response({"error": f"bad request ({e}): body must be JSON "
                                      '{"op": "add", "name", "raft", "client"} or '
                                      '{"op": "remove", "name"}'}, status=400)
        if not rlog.is_leader:
            leader = rlog.leader
            return web.json_response({"error": "not the leader", "leader": leader,
                                      "leader_address": server.addresses.get(leader or "")}, status=421)
        if op == "add":
            behind, why, storage = await _learner_lag(server, member)
            if behind is None:
                return web.json_response({"error": why}, status=409)
            if behind > CATCH_UP_SLACK:
                return web.json_response({"error": f"{member.name} is {behind} entries behind the leader; "
                                          "it keeps catching up as a learner: retry",
                                          "behind": behind}, status=409)
            member = Member(member.name, member.raft, member.client, storage)
        if op == "remove" and member.raft == rlog.config.address:
            return web.json_response({"error": f"{member.name} is the leader: transfer the leadership "
                                      "first (raftmq leader transfer)", "leads": True}, status=409)
        change = Change("add" if op == "add" else "rem", member)
        try:
            await asyncio.get_running_loop().run_in_executor(None, rlog.change_membership, change)
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        except (NotLeader, NoLeader) as e:
            return web.json_response({"error": str(e), "leader": rlog.leader,
                                      "leader_address": server.addresses.get(rlog.leader or "")},
                                     status=421)
        except ProposeError as e:
            return web.json_response({"error": str(e)}, status=503)
        return web.json_response(_members_doc(server))

    return [web.get("/admin/members", get_members), web.post("/admin/members", change_members)]
