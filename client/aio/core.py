"""What producers, consumers and the admin share: connections, routes, and the two ways
of reaching a group -- writes to its leader, reads from the replica ``read_from`` asks for.

``leader_request`` follows NOT_LEADER answers at once and retries NO_LEADER, lost
connections, timeouts and unknown outcomes with backoff until its deadline; DISK_FULL
(the leader answers, but members' disks are full) is retried at the same leader, and is
what the caller gets at the deadline. A write left unanswered for about an election
timeout has the other replicas asked who leads (``client.aio.leader_probe``); when one
names another leader at the newest term the write is resent there at once -- no fixed
attempt timeout stands between a failover and the client (issue 35). Every
write the client makes is safe to repeat (idempotent sends carry producer id and
sequence; offsets and topic configs are set, not added), so a retry after an unknown
outcome never duplicates anything.

``read_request`` reads from the replica ``read_from`` picks, healthy ones first. Given
``hold_s`` (a pull's long poll; 0 for a quick read), a read unanswered ``READ_GRACE_S``
past it -- or whose replica, holding a long poll, does not answer a liveness check -- is
overdue: the replica is read last for ``SUSPECT_S`` and the next one is asked at once
while the overdue read still races; the first answer wins, and any is right, since every
replica serves committed entries only (``client.aio.racing_read``; issue 35: pulls and
the orderly consumer's offset reads leave a stalled replica as writes leave a stalled
leader).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence

import mmh3

from client.aio.connection import ConnectionPool
from client.aio.leader_probe import PROBE_AFTER_S, PROBE_EVERY_S, LeaderProbe
from client.aio.racing_read import READ_GRACE_S, ReplicaLiveness, race_read
from client.aio.routes import RouteBook, default_namesrv
from client.backoff import Deadline, backoff_delays
from client.credentials import Credentials
from client.errors import BrokerError, ClientError, DiskFullError, NotLeaderError, RouteNotFoundError
from protocol.consumer import NotifyConsumersChanged
from protocol.deferred import CheckTransactionRequest
from protocol.pull import LeaderlessMark
from protocol.remoting import Frame, FrameError, RequestCode
from protocol.tls import ClientTls, resolve_tls
from protocol.wire import Request

__all__ = ["READ_FROM", "READ_GRACE_S", "ClientCore"]

log = logging.getLogger("client")

READ_FROM = ("follower", "leader", "any")
#: Retries of a write that found no leader pause at most this long (an election takes
#: 0.3-0.8 s; a longer pause would add to the failover).
RETRY_CAP_S = 0.2
#: A replica that timed out or dropped the connection is tried last for this long.
SUSPECT_S = 10.0
#: A replica that answered a read while knowing no leader is read last for this long.
LEADERLESS_S = 3.0


class ClientCore:
    def __init__(self, namesrv: str | Sequence[str] | None = None, servers: Sequence[str] | None = None,
                 *, client_id: str | None = None, request_timeout: float = 5.0,
                 route_refresh_s: float = 30.0, address_map: Mapping[str, str] | None = None,
                 tls: ClientTls | bool | None = None, credentials: Credentials | None = None) -> None:
        """``tls``: a ``ClientTls`` (wss:// and https:// verified against its CA), True (the
        system's CAs), False (plain), None (``$RAFTMQ_CA_FILE`` & co. decide: ``protocol.tls``).
        ``credentials``: the user every new connection authenticates as (ACLs on)."""
        ns = [namesrv] if isinstance(namesrv, str) else list(namesrv or [])
        if not ns and not servers:
            ns = default_namesrv()
        self.client_id = client_id or f"{socket.gethostname()}@{os.getpid()}@{os.urandom(3).hex()}"
        self.pool = ConnectionPool(on_request=self._on_request, tls=resolve_tls(tls),
                                   credentials=credentials)
        self.routes = RouteBook(self.pool, ns, list(servers or []), route_refresh_s, address_map)
        self.request_timeout = request_timeout
        self.on_notify: list[Callable[[str], None]] = []
        self.on_check_transaction: Callable[[str, CheckTransactionRequest], None] | None = None
        self._suspects: dict[str, float] = {}  # address -> until (monotonic): timed out lately
        self._leaderless: dict[str, float] = {}  # address -> until: answered a read knowing no leader
        self._probe = LeaderProbe(lambda address, request, timeout: self.pool.call(address, request, timeout),
                                  self.routes.dial)
        self._liveness = ReplicaLiveness(lambda address, request, timeout: self.pool.call(address, request,
                                                                                           timeout))

    def _on_request(self, address: str, frame: Frame) -> None:
        try:
            if frame.code == RequestCode.CHECK_TRANSACTION and self.on_check_transaction is not None:
                self.on_check_transaction(address, CheckTransactionRequest.from_frame(frame))
            elif frame.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
                group = NotifyConsumersChanged.from_frame(frame).group
                for cb in self.on_notify:
                    cb(group)
        except FrameError as e:
            log.warning("%s sent a request %d this client cannot read: %s", address, frame.code, e)

    async def leader_request(self, group: str, request: Request, *, deadline: Deadline,
                             topic: str | None = None) -> Frame:
        """Send a write to ``group``'s leader, following redirects and retrying retriable
        failures until ``deadline``. Raises the last error when the deadline passes."""
        delays = backoff_delays(first=0.05, cap=RETRY_CAP_S)
        last: ClientError | None = None
        tried: list[str] = []
        redirects = 0
        while True:
            candidates = self.routes.leader_candidates(group)
            if not candidates:
                if topic is None:
                    raise RouteNotFoundError(f"no replica of group {group!r} is known")
                await self.routes.route(topic, refresh=True)
                candidates = self.routes.leader_candidates(group)
            now = time.monotonic()  # a replica that just timed out (a hung old leader) goes last
            candidates.sort(key=lambda a: self._suspects.get(a, 0.0) > now)
            # rotate through replicas when the known leader keeps failing
            address = next((a for a in candidates if a not in tried), None)
            if address is None:
                tried.clear()
                address = candidates[0]
            try:
                reply, newer = await self._attempt(group, topic, address, request, deadline)
                if reply is not None:
                    return reply
                assert newer is not None
                self.routes.set_leader(group, newer)  # named at the newest term: resend there now
                self._suspects[address] = time.monotonic() + SUSPECT_S
                self._suspects.pop(self.routes.leader(group) or "", None)
                tried.clear()
                log.info("%s did not answer a write for %s; the other replicas name %s: resent there",
                         address, group, newer)
                continue
            except NotLeaderError as e:
                last = e
                if e.leader and e.leader != address:
                    self.routes.set_leader(group, e.leader)
                    named = self.routes.leader(group)
                    if named is not None:  # a replica names it: no longer suspect
                        self._suspects.pop(named, None)
                    tried.clear()
                    redirects += 1
                    if redirects <= 2 and not deadline.expired():
                        continue  # follow at once; repeated redirects back off below
                else:
                    tried.append(address)
            except DiskFullError as e:
                last = e  # the leader answered: ask it again after a pause, not the followers
            except BrokerError as e:
                if not e.retriable:
                    raise
                last = e
                tried.append(address)
            except ClientError as e:
                if not e.retriable:
                    raise
                last = e
                tried.append(address)
                self._suspects[address] = time.monotonic() + SUSPECT_S
                if self.routes.leader(group) == address:
                    self.routes.set_leader(group, None)
            if deadline.expired():
                assert last is not None
                raise last
            await asyncio.sleep(min(next(delays), deadline.remaining()))

    async def _attempt(self, group: str, topic: str | None, address: str, request: Request,
                       deadline: Deadline) -> tuple[Frame | None, str | None]:
        """One write to ``address``: (its answer, None), or (None, the leader the other
        replicas name) when it waited ``PROBE_AFTER_S`` and they name another one at the
        newest term (the write is abandoned: its outcome is unknown, a resend is safe).
        Raises what the request raises (its timeout: the client's ``request_timeout``)."""
        timeout = max(0.05, min(self.request_timeout, deadline.remaining()))
        pending = asyncio.ensure_future(self.pool.request(address, request, timeout=timeout))
        wait = PROBE_AFTER_S
        try:
            while True:
                done, _ = await asyncio.wait({pending}, timeout=wait)
                if done:
                    return pending.result(), None
                wait = PROBE_EVERY_S
                probe_topic = topic or self.routes.topic_of(group)
                if probe_topic is None:
                    return await pending, None  # nothing to ask the others about
                newer = await self._probe.newer_leader(group, probe_topic, self.routes.replicas(group),
                                                       address, timeout=PROBE_AFTER_S)
                if pending.done():
                    return pending.result(), None
                if newer is not None:
                    return None, newer
        finally:
            if not pending.done():
                pending.cancel()

    def read_replicas(self, group: str, read_from: str, affinity: str = "") -> list[str]:
        """Replicas to read from, best first: "follower" -- the followers (spread by
        ``affinity``), the leader last (read only when no follower answers); "leader" --
        the leader, then followers; "any" -- all, spread. Within that order a replica that
        lately timed out, then one that answered knowing no leader, goes last."""
        replicas = self.routes.replicas(group)
        leader = self.routes.leader(group)
        followers = [a for a in replicas if a != leader]
        if followers and affinity:
            k = mmh3.hash(affinity, signed=False) % len(followers)
            followers = followers[k:] + followers[:k]
        if read_from == "leader":  # the leader, then followers (their state is committed too)
            return self._healthy_first(([leader] if leader else []) + followers)
        if read_from == "follower":  # the leader only when no follower answers
            return self._healthy_first(followers) + ([leader] if leader else [])
        both = followers + ([leader] if leader else [])
        if both and affinity:
            k = mmh3.hash(affinity + "#any", signed=False) % len(both)
            both = both[k:] + both[:k]
        return self._healthy_first(both)

    def _healthy_first(self, addresses: list[str]) -> list[str]:
        """A replica that recently timed out or was overdue may be stalled, one that answered
        knowing no leader may be cut off (and behind): the others first, those last -- still
        read when nothing else answers."""
        now = time.monotonic()
        return sorted(addresses, key=lambda a: (self._suspects.get(a, 0.0) > now,
                                                self._leaderless.get(a, 0.0) > now))

    async def read_request(self, group: str, request: Request, *, read_from: str = "follower",
                           affinity: str = "", timeout: float | None = None,
                           ok: tuple[int, ...] = (0,), hold_s: float | None = None,
                           topic: str | None = None) -> Frame:
        """A read from a replica chosen by ``read_from``, trying the next one on a failure.
        ``hold_s``: how long a replica may rightly hold this read (a pull's long poll, 0 for
        a quick one); unanswered ``READ_GRACE_S`` longer, or silent to a liveness check
        meanwhile, the read is overdue and the next replica is asked at once, the overdue
        read still racing (``client.aio.racing_read``). None: one replica after another,
        each for the whole ``timeout`` (admin reads, whose queries may take long).
        ``topic``: what a liveness check asks the replica about (default: a topic of the
        group's the route book holds). Raises the last retriable error when every replica
        failed, a non-retriable one at once."""
        timeout = timeout or self.request_timeout
        addresses = self.read_replicas(group, read_from, affinity)
        if not addresses:
            raise RouteNotFoundError(f"no replica of group {group!r} is known")
        topic = topic or self.routes.topic_of(group)
        address, reply = await race_read(
            addresses,
            lambda address: self.pool.request(address, request, timeout=timeout, ok=ok),
            hold_s=hold_s, on_stalled=self._suspect,
            alive=None if topic is None else lambda address: self._liveness.alive(address, topic))
        self._note_read(address, reply)
        return reply

    def _suspect(self, address: str) -> None:
        """``address`` timed out or held a read past its time: read last for SUSPECT_S."""
        self._suspects[address] = time.monotonic() + SUSPECT_S

    def _note_read(self, address: str, reply: Frame) -> None:
        """A replica answered: no longer suspect, unless it knows no leader."""
        if LeaderlessMark.read(reply):
            self._leaderless[address] = time.monotonic() + LEADERLESS_S
        else:
            self._leaderless.pop(address, None)
            self._suspects.pop(address, None)

    async def close(self) -> None:
        await self.pool.close()
