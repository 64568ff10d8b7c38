"""Issue 25, row 8: properties the broker gives meaning to are the broker's.

Before: a producer leaving a record's SPECIAL flag unset could store messages carrying
``RETRY_TOPIC`` (consumers then show another topic, and the console's dead-letter resend
sends the copy there with the operator's rights), ``__`` properties, or ``TRAN_MSG`` that
no transaction handled. Now a record whose flag disagrees with its messages' properties is
malformed (``check_messages``), and ``RETRY_TOPIC`` and ``__`` properties are refused from
clients whatever the flags. A one-replica broker process, stopped by PID.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import pytest

from protocol.record_batch import FLAG_SPECIAL, encode_record
from protocol.remoting import ResponseCode
from protocol.send import SendMessageRequest
from raftmq.local_group import LocalGroup
from tests.support.broker_client import FrameClient, client_session
from tests.support.client_calls import create_topic_at
from tests.support.procs import led

pytestmark = [pytest.mark.cluster]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    group = LocalGroup(tmp_path_factory.mktemp("reserved") / "g", 1, module="broker")
    with led(group, LocalGroup.wait_leader):
        address = group.nodes["n1"].http
        create_topic_at([address], "orders", 1)
        yield address


def record(props: dict[str, str], flagged: bool) -> bytes:
    data = bytearray(encode_record("orders", 0, [(os.urandom(16), int(time.time() * 1000), 0, None, None,
                                                  props, 0, b"body")]))
    data[1] = data[1] | FLAG_SPECIAL if flagged else data[1] & ~FLAG_SPECIAL
    return bytes(data)


def send(address: str, data: bytes) -> tuple[int, str]:
    async def go() -> tuple[int, str]:
        async with client_session() as session:
            client = await FrameClient.connect(session, address)
            try:
                answer = await client.raw(SendMessageRequest(message=data).to_frame(1).encode())
                return answer.code, answer.remark or ""
            finally:
                await client.close()
    return asyncio.run(go())


@pytest.mark.parametrize("props", [{"RETRY_TOPIC": "payroll"}, {"__SCHEDULED_FROM": "0"},
                                   {"TRAN_MSG": "true", "PGROUP": "p"}, {"__DELIVER_AT_MS": "1"}])
def test_reserved_properties_are_refused_whatever_the_flag(broker: str, props: dict[str, str]) -> None:
    for flagged in (False, True):
        if "TRAN_MSG" in props and flagged:
            continue  # a half, flagged as it must be: a transaction producer's right
        code, remark = send(broker, record(props, flagged))
        assert code == ResponseCode.INVALID_ARGUMENT, (props, flagged, code, remark)
        assert next(iter(props)) in remark, remark


def test_user_properties_still_go(broker: str) -> None:
    assert send(broker, record({"region": "eu"}, False))[0] == ResponseCode.SUCCESS
