"""Issue 25, row 2: request codes a client invents do not grow the broker's memory.

Before: 3,000 frames with codes the broker does not serve, sent with no credentials, grew
``/metrics`` from ~8 KB (7.9 KB in the review, 7.7 KB in the fix's failing run) to 191 KB --
one ``raftmq_requests_total`` child per code, made before the handler lookup and the ACL
check (a million codes ~800 MB, and each scrape blocked the event loop). Now only served
codes have a child of their own; the rest count under ``code="unknown"``. A one-replica
broker process, stopped by PID.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Iterator

import pytest

from protocol.remoting import RequestCode, ResponseCode
from raftmq.local_group import LocalGroup
from tests.support.broker_client import FrameClient, client_session
from tests.support.procs import led

pytestmark = [pytest.mark.cluster]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    group = LocalGroup(tmp_path_factory.mktemp("labels") / "g", 1, module="broker")
    with led(group, LocalGroup.wait_leader):
        yield group.nodes["n1"].http


def metrics(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def test_invented_request_codes_share_one_label(broker: str) -> None:
    before = len(metrics(broker))
    served = {int(c) for c in RequestCode}
    codes = [c for c in range(20_000, 40_000) if c not in served][:3000]

    async def flood() -> None:
        async with client_session() as session:
            client = await FrameClient.connect(session, broker)
            try:
                for start in range(0, len(codes), 500):
                    answers = await asyncio.gather(*(client.call(c) for c in codes[start:start + 500]))
                    assert {a.code for a in answers} == {ResponseCode.REQUEST_CODE_NOT_SUPPORTED}
                await client.call(RequestCode.GET_TOPICS)
            finally:
                await client.close()

    asyncio.run(flood())
    text = metrics(broker)
    assert len(text) - before < 4096, f"/metrics grew {before} -> {len(text)} bytes"
    unknown = re.search(r'raftmq_requests_total\{[^}]*code="unknown"[^}]*\} (\S+)', text)
    assert unknown is not None and float(unknown.group(1)) == len(codes), text[-2000:]
    assert re.search(rf'raftmq_requests_total\{{[^}}]*code="{int(RequestCode.GET_TOPICS)}"', text)
