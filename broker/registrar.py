"""A broker replica's registrations with its name servers (``broker.namesrv.server`` for the wire).

Every 0.5 s the registrar looks at the replica's role, term, members and topic table; it
registers with each name server when one of them changed, and every 30 s regardless.
The topic table travels as changes, not whole:

    name server holds  ──────────────  what is sent
    nothing / unknown                  the whole table at a new version, in pages of at
                                       most PAGE_BYTES of names (a restart of either side)
    version V                          a delta V -> V' (topics set, topics removed), split
                                       into chained deltas when large; no change: V -> V,
                                       which renews the registration
    a 409 answer                       the whole table again (the name server lost V)

Versions are ``<random per process>:<counter>``: tokens between this process and one name
server, not shared with other replicas. Each request is signed with the group's
registration key (``broker.security.registration_auth``), derived from the group's secret, and sent
over https when the replica serves TLS (``broker.security.tls``). A
replica that is not (yet) a member -- a learner being added -- does not register.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

from broker.namesrv.server import REGISTER_EVERY_S
from broker.security.registration_auth import registration_key, sign_registration
from dledger.log import Log
from protocol.tls import ClientTls, http_url

__all__ = ["PAGE_BYTES", "Registrar", "held_topics", "topic_pages"]

log = logging.getLogger("broker.registrar")

POLL_S = 0.5
PAGE_BYTES = 512 * 1024  # names and values per request, well under the name server's 1 MiB
REFUSED_RETRY_S = 5.0
_WARN_EVERY_S = 60.0


def held_topics(machine: Any) -> dict[str, Any]:
    """The replica's topic table, name -> config (``.queues``, ``.perm``), copied in one step
    (the apply thread changes it). Unchanged configs are the same objects between calls,
    so comparing two copies is cheap. The one place that reads the state machine's table."""
    return dict(machine.topics)


def _value(config: Any) -> list[int]:
    return [int(config.queues), int(config.perm)]


def topic_pages(items: list[tuple[str, Any]]) -> Iterator[list[tuple[str, Any]]]:
    """``items`` cut into runs of at most PAGE_BYTES (a name, its value and JSON's quotes)."""
    page: list[tuple[str, Any]] = []
    size = 0
    for item in items:
        cost = len(item[0]) + 24
        if page and size + cost > PAGE_BYTES:
            yield page
            page, size = [], 0
        page.append(item)
        size += cost
    yield page


class _Refused(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"{status} {text}")
        self.status = status


class _Resync(Exception):
    pass


@dataclass(slots=True)
class _Held:
    """What one name server holds for this replica, as far as this replica knows."""

    topics: dict[str, Any] | None = None  # None: unknown, send the whole table
    version: str = ""
    identity: dict[str, Any] | None = None
    next_at: float = 0.0  # the next renewal
    retry_at: float = 0.0  # after a refusal
    warned: dict[str, float] = field(default_factory=dict)


class Registrar:
    """Registers one replica with ``namesrvs``; ``run`` until cancelled (event loop only)."""

    def __init__(self, rlog: Log, machine: Any, listen: str, namesrvs: list[str],
                 register_every_s: float = REGISTER_EVERY_S, tls: ClientTls | None = None) -> None:
        """``tls``: how to dial the name servers (None: plain HTTP)."""
        self._rlog = rlog
        self._tls = tls
        self._every = register_every_s
        self._machine = machine
        self._listen = listen
        self._held = {ns: _Held() for ns in namesrvs}
        config = rlog.config
        self._group: str = config.group
        self._key = registration_key(config.secret, config.group) if config.secret else None
        self._versions = (f"{os.urandom(4).hex()}:{i}" for i in itertools.count(1))

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(ssl=self._tls.context() if self._tls is not None else True)
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            while True:
                await self.register_once(session)
                await asyncio.sleep(POLL_S)

    def identity(self) -> dict[str, Any] | None:
        """This replica's registration without topics; None while it is not a member."""
        status = self._rlog.status()
        if not status.member:
            return None
        config = self._rlog.config
        return {"group": config.group, "node": config.node, "role": status.role, "term": status.term,
                "address": self._listen, "members": sorted(self._rlog.members())}

    async def register_once(self, session: aiohttp.ClientSession) -> None:
        """Register with every name server that is due (module docstring)."""
        identity = self.identity()
        if identity is None:
            return
        topics = held_topics(self._machine)
        now = time.monotonic()
        for ns, held in self._held.items():
            changed = identity != held.identity or topics != held.topics
            if not (changed or now >= held.next_at) or now < held.retry_at:
                continue
            try:
                await self._sync(session, ns, held, identity, topics)
            except _Refused as e:
                held.retry_at = now + REFUSED_RETRY_S
                self._warn(ns, held, f"s{e.status}", f"name server {ns} refused the registration: {e}")
                continue
            except (aiohttp.ClientError, TimeoutError) as e:  # retried on the next poll
                self._warn(ns, held, "down", f"cannot register with name server {ns}: {e!r}")
                continue
            held.identity, held.next_at = identity, now + self._every

    async def _sync(self, session: aiohttp.ClientSession, ns: str, held: _Held,
                    identity: dict[str, Any], topics: dict[str, Any]) -> None:
        if held.topics is not None:
            try:
                await self._send_delta(session, ns, held, identity, topics)
                return
            except _Resync:
                log.info("name server %s lacks this replica's topics: sending the whole table", ns)
        await self._send_full(session, ns, held, identity, topics)

    async def _send_delta(self, session: aiohttp.ClientSession, ns: str, held: _Held,
                          identity: dict[str, Any], topics: dict[str, Any]) -> None:
        assert held.topics is not None
        old = held.topics
        changed = [(t, c) for t, c in topics.items() if old.get(t) is not c and old.get(t) != c]
        removed = [(t, None) for t in old if t not in topics]
        runs = list(topic_pages(changed + removed)) if changed or removed else [[]]
        for run in runs:
            version = next(self._versions)
            doc = {"kind": "delta", "base": held.version, "version": version,
                   "set": {t: _value(c) for t, c in run if c is not None},
                   "removed": [t for t, c in run if c is None]}
            await self._post(session, ns, {**identity, "topics": doc})
            sent = dict(held.topics)
            for t, c in run:
                if c is None:
                    sent.pop(t, None)
                else:
                    sent[t] = c
            held.topics, held.version = sent, version

    async def _send_full(self, session: aiohttp.ClientSession, ns: str, held: _Held,
                         identity: dict[str, Any], topics: dict[str, Any]) -> None:
        held.topics = None
        version = next(self._versions)
        pages = list(topic_pages(sorted(topics.items())))
        for i, page in enumerate(pages):
            doc = {"kind": "full", "version": version, "page": i, "pages": len(pages),
                   "set": {t: _value(c) for t, c in page}}
            try:
                await self._post(session, ns, {**identity, "topics": doc})
            except _Resync:
                raise aiohttp.ClientError(f"name server {ns} lost the table mid-way (restarted?)") from None
        held.topics, held.version = topics, version

    async def _post(self, session: aiohttp.ClientSession, ns: str, doc: Mapping[str, Any]) -> None:
        body = msgspec.json.encode(doc)
        headers = {"Content-Type": "application/json"}
        if self._key is not None:
            headers.update(sign_registration(self._key, self._group, body))
        async with session.post(http_url(ns, "/register", self._tls is not None), data=body,
                                headers=headers) as resp:
            if resp.status == 200:
                return
            text = await resp.text()
            if resp.status == 409:
                raise _Resync(text)
            raise _Refused(resp.status, text)

    def _warn(self, ns: str, held: _Held, kind: str, message: str) -> None:
        now = time.monotonic()
        if now - held.warned.get(kind, -_WARN_EVERY_S) >= _WARN_EVERY_S:
            held.warned[kind] = now
            log.warning("%s (repeats are logged once a minute)", message)
