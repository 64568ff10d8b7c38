"""A replica whose CommitLog ends before the state it applied does not serve reads.

``--repair-log`` (or a tail cut below the commit index it had learned) leaves a replica's
derived state -- ConsumeQueue units, offsets -- ahead of its CommitLog until it fetches the
cut entries again from the leader. Found by the disk-loss chaos test: a consumer pulling
from such a replica was told 80 acknowledged messages were "no longer retained" (the
units named CommitLog positions the cut log did not hold, read as deleted by retention)
and skipped them. Such a replica now answers SYSTEM_BUSY, naming why, so clients read
from another replica, and serves again once its log holds what it applied.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from client import Message, Producer
from protocol.remoting import RequestCode, ResponseCode
from tests.support.broker_client import FrameClient
from tests.support.broker_group import create_topic, running_brokers, servers
from tests.support.log_damage import flip_a_byte

pytestmark = [pytest.mark.cluster]

SENT = 300


async def _pull(address: str, offset: int) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session:
        client = await FrameClient.connect(session, address)
        try:
            r = await client.call(RequestCode.PULL_MESSAGE, {"topic": "t", "queueId": 0, "offset": offset,
                                                              "maxMsgs": 32})
            return r.code, r.remark or ""
        finally:
            await client.close()


def test_a_replica_whose_log_ends_before_its_applied_state_does_not_serve_reads(tmp_path: Path) -> None:
    with running_brokers(tmp_path / "g") as group:
        create_topic(group, "t", 1)
        with Producer(servers=servers(group)) as producer:
            for i in range(SENT):
                producer.send(Message("t", f"m{i:04d}".encode() + b"." * 200))
        leader = group.wait_leader()
        target = group.status(leader)["commit_index"]  # type: ignore[index]
        for name in group.nodes:
            group.wait_status(name, lambda s: s["applied_index"] >= target, 60, f"apply of {target}")
        repaired = next(n for n in group.nodes if n != leader)
        position = group.status(repaired)["write_position"]  # type: ignore[index]
        for name in [repaired, *(n for n in group.nodes if n != repaired)]:
            group.kill(name)  # the others too: nobody to fetch the cut entries from
        flip_a_byte(group.base / repaired / "commitlog", position // 2)
        group.start_node(repaired, "--repair-log")
        status = group.wait_status(repaired, lambda s: True, 30, "up")
        assert status["applied_index"] > status["last_index"], status  # the premise: state ahead of log
        code, remark = asyncio.run(_pull(group.nodes[repaired].http, SENT - 10))
        assert code == ResponseCode.SYSTEM_BUSY, (ResponseCode(code).name, remark)
        assert "does not serve" in remark and "CommitLog" in remark, remark
        others = [n for n in group.nodes if n != repaired]
        for name in others:
            group.start_node(name)
        group.wait_status(repaired, lambda s: s["last_index"] >= s["applied_index"], 60, "its log caught up")
        code, remark = asyncio.run(_pull(group.nodes[repaired].http, SENT - 10))
        assert code == ResponseCode.SUCCESS, (ResponseCode(code).name, remark)
