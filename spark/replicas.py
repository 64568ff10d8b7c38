"""Which replica of a broker group serves a read (``readFrom``) -- Spark-free.

A replica's role comes from its own ``/status``, asked when a plan is made and whenever a
partition (re)chooses its replica -- not from a route that may be up to 30 s old.
``follower``: followers only, never the leader; ``any``: followers, and the leader only
when no follower answers; ``leader``: the leader, followers when it is down. A
follower's ConsumeQueues hold only applied -- hence committed -- messages.

Used by the planner (``spark.planning``: whose bounds a plan takes) and by the partition
reader (``spark.range_reader``: which replica a range is read from).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import aiohttp

from client.aio.core import ClientCore

__all__ = ["no_replica_message", "plan_sources", "read_order", "replica_roles"]

_STATUS_TIMEOUT_S = 2.0


async def replica_roles(core: ClientCore, addresses: Sequence[str],
                        timeout: float = _STATUS_TIMEOUT_S) -> dict[str, str | None]:
    """Each replica's role from its ``/status`` ("leader", "follower", "candidate"); None
    for one that does not answer."""
    async def one(address: str) -> tuple[str, str | None]:
        try:
            async with core.pool.session.get(core.pool.url(address, "/status"),
                                             timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if resp.status != 200:
                    return address, None
                doc = await resp.json()
                return address, str(doc.get("role"))
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return address, None

    return dict(await asyncio.gather(*(one(a) for a in addresses)))


def read_order(roles: Mapping[str, str | None], read_from: str, preferred: str | None = None) -> list[str]:
    """The replicas that may serve a read, best first (module docstring): live ones only,
    ``preferred`` first among the followers."""
    up = sorted(a for a, role in roles.items() if role is not None)
    leaders = [a for a in up if roles[a] == "leader"]
    followers = [a for a in up if roles[a] != "leader"]
    if preferred in followers:
        followers.remove(preferred)
        followers.insert(0, preferred)
    if read_from == "follower":
        return followers
    if read_from == "any":
        return followers + leaders
    return leaders + followers


def plan_sources(roles: Mapping[str, str | None], read_from: str) -> list[str]:
    """The replicas a plan takes bounds from: the ones its partitions will read from."""
    up = sorted(a for a, role in roles.items() if role is not None)
    leaders = [a for a in up if roles[a] == "leader"]
    followers = [a for a in up if roles[a] != "leader"]
    if read_from == "follower":
        return followers
    if read_from == "any":
        return followers or leaders
    return leaders or followers


def no_replica_message(group: str, read_from: str, roles: Mapping[str, str | None]) -> str:
    seen = ", ".join(f"{a} {role or 'down'}" for a, role in sorted(roles.items()))
    hint = " (readFrom=any lets the leader serve when no follower can)" if read_from == "follower" else ""
    return f"no replica of group {group!r} can serve readFrom={read_from}: {seen or 'none known'}{hint}"
