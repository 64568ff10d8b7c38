"""``raftmq cluster verify`` on the brokers: the leader proposes a verify marker, every
replica digests at it (``broker.state.marker_digest``), the leader gathers their answers and
compares them (``broker.replication.verify_compare``)::

    POST /admin/verify            on the leader, {"timeout_s": 30} (optional): propose a marker
                                  at the highest retained log start of the members that answer,
                                  wait until every member has digested at it or the deadline
                                  passed, compare; answers the comparison (a follower: 421
                                  naming the leader; the marker not proposed: 503)
    GET  /admin/verify/{index}    this replica's digests at the marker applied at ``index``:
                                  "state" "done", "reading" (its ConsumeQueues being read
                                  back), "incomplete" (why), "not applied" (its applied index
                                  is below), "unknown" (applied past it without a digest held:
                                  restarted since, or restored from a snapshot past it);
                                  ``?rows=1`` adds every queue's row

The leader asks each member over its client port with the caller's own admin token (a
token is valid on every replica of its group: ``broker.security.scram_auth``), so the members'
ACLs decide as for the caller. A member that does not answer for ``DOWN_AFTER_S`` is not
waited for; one behind or still reading is waited for until the deadline, then named.

The last comparison this replica made is kept in ``LAST_VERIFY`` in its data directory
(index, when, outcome, replicas compared) and shown in ``/status`` as ``last_verify``;
``last_marker`` there is the newest marker this replica digested.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
import msgspec
from aiohttp import web

from broker.replication.verify_compare import Comparison, compare, needs_rows
from broker.state.machine import BrokerStateMachine
from broker.state.marker_digest import DONE, READING
from broker.store.commands import VerifyMarker, encode_admin
from common.durable_file import atomic_write, read_or_none
from common.http_errors import read_json
from dledger.errors import NoLeader, NotLeader, ProposeError

if TYPE_CHECKING:
    from broker.http_api.server_view import ServerView

__all__ = ["DEFAULT_TIMEOUT_S", "DOWN_AFTER_S", "LAST_VERIFY", "Verifier", "replica_answer"]

log = logging.getLogger("broker.verify")

DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 600.0
DOWN_AFTER_S = 3.0
POLL_S = 0.2
LAST_VERIFY = "LAST_VERIFY"  # in the data directory: the last comparison made here (JSON)
_ASK_TIMEOUT = aiohttp.ClientTimeout(total=3)
_ROWS_TIMEOUT = aiohttp.ClientTimeout(total=60)

Answer = dict[str, Any] | str  # a replica's JSON answer, or why there is none


class _VerifyDoc(msgspec.Struct):
    timeout_s: float = DEFAULT_TIMEOUT_S


def replica_answer(machine: BrokerStateMachine, index: int, with_rows: bool = False) -> dict[str, Any]:
    """What this replica holds of the marker at ``index`` (module docstring)."""
    applied = machine.applied_index()
    result = machine.markers.get(index)
    if result is None:
        if applied < index:
            return {"index": index, "state": "not applied", "applied_index": applied,
                    "why": f"it has applied entries up to {applied} only"}
        return {"index": index, "state": "unknown", "applied_index": applied,
                "why": "it holds no digest at this index (restarted since it applied it, or restored "
                       "from a snapshot past it)"}
    doc = {**result.summary(), "applied_index": applied}
    if with_rows and result.state == DONE:
        doc["rows"] = result.rows
    return doc


class Verifier:
    """The verify routes of one ``ServerView`` (event loop only) and its last comparison."""

    def __init__(self, server: ServerView) -> None:
        self._server = server
        self._path = server.rlog.config.data_dir / LAST_VERIFY
        self.last: dict[str, Any] | None = None
        kept = read_or_none(self._path)
        if kept is not None:
            try:
                self.last = dict(json.loads(kept))
            except (ValueError, TypeError):
                log.warning("%s is not a comparison: ignored", self._path)

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/admin/verify", self.post), web.get("/admin/verify/{index}", self.get)]

    def status(self) -> dict[str, Any]:
        """``/status``'s part: the last comparison made here, the newest marker digested."""
        marker = self._server.machine.markers.last()
        return {"last_verify": self.last,
                "last_marker": None if marker is None else {
                    "index": marker.index, "at_ms": marker.at_ms, "state": marker.state}}

    async def get(self, request: web.Request) -> web.Response:
        try:
            index = int(request.match_info["index"])
        except ValueError:
            return web.json_response({"error": "the index is a number"}, status=400)
        doc = replica_answer(self._server.machine, index, request.query.get("rows") == "1")
        return web.json_response({"node": self._server.rlog.config.node, **doc})

    async def post(self, request: web.Request) -> web.Response:
        doc = await read_json(request, _VerifyDoc) if request.can_read_body else _VerifyDoc()
        timeout = min(max(doc.timeout_s, 1.0), MAX_TIMEOUT_S)
        server = self._server
        try:
            server.require_leader()
        except (NotLeader, NoLeader) as e:
            leader = server.rlog.leader
            return web.json_response({"error": str(e), "leader": leader,
                                      "leader_address": server.addresses.get(leader or "")}, status=421)
        auth = request.headers.get("Authorization")
        headers = {"Authorization": auth} if auth else {}
        members = dict(server.addresses)
        marker = VerifyMarker(secrets.token_hex(8), await self._common_log_start(members))
        try:
            (applied,) = await server.write.send([encode_admin(marker)])
        except ProposeError as e:
            return web.json_response({"error": f"the verify marker was not proposed: {e}"}, status=503)
        result = server.machine.markers.by_id(marker.marker_id)
        if result is None:
            return web.json_response({"error": f"the verify marker was not applied: {applied.reason}"},
                                     status=503)
        answers = await self._gather(members, result.index, timeout, headers)
        rows = await self._rows(members, answers, result.index, headers) if needs_rows(answers) else None
        comparison = compare(result.index, answers, rows)
        self._record(comparison)
        return web.json_response({"group": server.rlog.config.group, "leader": server.rlog.config.node,
                                  **comparison.to_json()})

    # -- asking the members ------------------------------------------------------------------
    async def _common_log_start(self, members: Mapping[str, str]) -> int:
        """The highest CommitLog start position among this leader and the members that answer:
        every member holds the ConsumeQueue units of the records from there on."""
        me = self._server.rlog.config.node
        starts = [self._server.rlog.reader.start_position]
        answers = await asyncio.gather(*(self._json(a, "/status", {}) for n, a in members.items() if n != me))
        starts += [int(a["log_start_position"]) for a in answers
                   if isinstance(a, dict) and isinstance(a.get("log_start_position"), int)]
        return max(starts)

    async def _gather(self, members: Mapping[str, str], index: int, timeout: float,
                      headers: Mapping[str, str]) -> dict[str, Answer]:
        """Every member's answer at ``index``: polled until final, or the deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        final: dict[str, Answer] = {}
        latest: dict[str, Answer] = {}
        silent_since: dict[str, float] = {}
        while True:
            waiting = sorted(n for n in members if n not in final)
            answers = await asyncio.gather(*(self._ask(n, members[n], index, headers) for n in waiting))
            now = loop.time()
            for node, answer in zip(waiting, answers, strict=True):
                latest[node] = answer
                if answer is None:
                    if now - silent_since.setdefault(node, now) >= DOWN_AFTER_S:
                        final[node] = "it does not answer (down, or unreachable from the leader)"
                elif isinstance(answer, str) or answer.get("state") not in (READING, "not applied"):
                    final[node] = answer
                else:
                    silent_since.pop(node, None)
            if len(final) == len(members) or now >= deadline:
                break
            await asyncio.sleep(POLL_S)
        for node in members:
            if node not in final:
                final[node] = _late(latest.get(node), index, timeout)
        return final

    async def _ask(self, node: str, address: str, index: int, headers: Mapping[str, str],
                   rows: bool = False) -> Answer | None:
        """A member's answer (None: it does not answer; a string: it refused, saying why)."""
        if node == self._server.rlog.config.node:
            return replica_answer(self._server.machine, index, rows)
        return await self._json(address, f"/admin/verify/{index}", {"rows": "1"} if rows else {}, headers,
                                _ROWS_TIMEOUT if rows else _ASK_TIMEOUT)

    async def _rows(self, members: Mapping[str, str], answers: Mapping[str, Answer], index: int,
                    headers: Mapping[str, str]) -> dict[str, list[Any]]:
        """The queue rows of the members done (their queues digests differ)."""
        done = [n for n, a in answers.items() if isinstance(a, dict) and a.get("state") == DONE]
        fetched = await asyncio.gather(*(self._ask(n, members[n], index, headers, rows=True) for n in done))
        return {n: list(a["rows"]) for n, a in zip(done, fetched, strict=True)
                if isinstance(a, dict) and isinstance(a.get("rows"), list)}

    async def _json(self, address: str, path: str, query: Mapping[str, str],
                    headers: Mapping[str, str] | None = None,
                    timeout: aiohttp.ClientTimeout = _ASK_TIMEOUT) -> Answer | None:
        try:
            async with self._server.http_session().get(self._server.peer_url(address, path), params=query,
                                                       headers=headers or {}, timeout=timeout) as resp:
                if resp.status == 200:
                    return dict(await resp.json())
                try:
                    why = (await resp.json()).get("error") or resp.reason
                except (aiohttp.ContentTypeError, ValueError):
                    why = resp.reason
                return f"it refused the request ({resp.status}: {why})"
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None

    def _record(self, comparison: Comparison) -> None:
        self.last = {"index": comparison.index, "at_ms": int(time.time() * 1000),
                     "outcome": comparison.outcome, "compared": comparison.compared,
                     "not_compared": [n for n, _ in comparison.not_compared],
                     "mismatches": len(comparison.mismatches)}
        log.log(logging.INFO if comparison.outcome == "equal" else logging.WARNING,
                "verify at index %d: %s (%d replicas compared)", comparison.index, comparison.outcome,
                len(comparison.compared))
        try:
            atomic_write(self._path, json.dumps(self.last).encode())
        except OSError as e:
            log.warning("cannot keep the last comparison in %s: %s", self._path, e)


def _late(answer: Answer | None, index: int, timeout: float) -> str:
    """Why a member is not compared at the deadline."""
    if answer is None:
        return "it does not answer (down, or unreachable from the leader)"
    if isinstance(answer, str):
        return answer
    if answer.get("state") == READING:
        return f"it was still reading back its ConsumeQueues after {timeout:g} s"
    return (f"it had applied entries up to {answer.get('applied_index')} only, not the marker at {index}, "
            f"after {timeout:g} s: it is behind")
