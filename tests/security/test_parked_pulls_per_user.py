"""Issue 25, row 9: one user cannot take every parked long poll.

Before: parked pulls were bounded per connection (1,024) and per broker (16,384) only, so
one user over 16 connections held them all and every other user's long polls were answered
SYSTEM_BUSY at once. Now a user parks at most ``max_parked_pulls_per_user`` (a quarter of
``max_parked_pulls`` unless set). Three broker processes with ACLs on and
``max_parked_pulls = 8``, stopped by PID.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from client import Admin, Credentials
from protocol.remoting import RequestCode, ResponseCode
from raftmq.local_group import LocalGroup
from tests.security.acl_cluster import ROOT, acl_brokers, leader_address, run
from tests.support.broker_client import FrameClient, client_session
from tests.support.broker_group import servers

pytestmark = [pytest.mark.cluster]

MALLORY = Credentials("mallory", "mallory-password")
ALICE = Credentials("alice", "alice-password")
TOTAL = 8


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGroup]:
    with acl_brokers(tmp_path_factory.mktemp("parked") / "g", max_parked_pulls=TOTAL) as g:
        admin = Admin(servers=servers(g), credentials=ROOT)
        try:
            admin.create_topic("idle", queues=1)
            for who in (MALLORY, ALICE):
                admin.put_user(who.user, who.password)
                admin.grant(who.user, "topic:idle", ["sub"])
        finally:
            admin.close()
        yield g


def _pull(conn: FrameClient, suspend_ms: int) -> asyncio.Task:  # type: ignore[type-arg]
    return asyncio.create_task(conn.call(RequestCode.PULL_MESSAGE, {
        "topic": "idle", "queueId": 0, "offset": 0, "suspendMs": suspend_ms}, timeout=30))


def test_one_user_cannot_park_every_pull(group: LocalGroup) -> None:
    address = leader_address(group)

    async def go() -> tuple[list[int], list[str], int]:
        async with client_session(None) as session:
            mallory = await FrameClient.connect(session, address)
            alice = await FrameClient.connect(session, address)
            try:
                for conn, who in ((mallory, MALLORY), (alice, ALICE)):
                    _, _, answer = await conn.login(who.user, who.password)
                    assert answer.code == ResponseCode.SUCCESS, answer.remark
                hers = [_pull(mallory, 20_000) for _ in range(TOTAL)]
                await asyncio.sleep(1.0)
                answered = [p.result() for p in hers if p.done()]
                alices = _pull(alice, 1_500)
                answer = await alices
                for p in hers:
                    p.cancel()
                return [a.code for a in answered], [a.remark or "" for a in answered], answer.code
            finally:
                await mallory.close()
                await alice.close()

    codes, remarks, alices = run(go())
    assert alices != ResponseCode.SYSTEM_BUSY, "another user's long poll was refused: one user held them all"
    assert codes and set(codes) == {ResponseCode.SYSTEM_BUSY}, codes
    assert "by user 'mallory'" in remarks[0], remarks[0]
