"""Issue 25, row 9: a send-back copies only a message its caller may read.

Before: CONSUMER_SEND_MSG_BACK needed ``sub`` on the group and on the topic of the record
at the position, and copied whatever was there into the group's retry topic -- a delayed
message before its time (the copy's own retry delay replaced it), an uncommitted
transaction half, a message of a deleted topic. Now the message must be in its topic's
consume queue (what a consumer can pull); else INVALID_ARGUMENT. Three broker processes
with ACLs on, stopped by PID.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from client import Admin, Credentials
from protocol.deferred import SendBackRequest
from protocol.message_format import Message, encode_message
from protocol.remoting import ResponseCode
from protocol.send import SendMessageRequest, WriteResponse
from raftmq.local_group import LocalGroup
from tests.security.acl_cluster import ROOT, leader_address, prepared_acl_brokers, run, session_call
from tests.support.broker_group import servers

pytestmark = [pytest.mark.cluster]

CAROL = Credentials("carol", "carol-password")


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGroup]:
    with prepared_acl_brokers(tmp_path_factory.mktemp("sendback") / "g", ["orders", "doomed"],
                              [(CAROL, [("topic:*", ["pub", "sub"]), ("group:*", ["pub", "sub"])])]) as g:
        yield g


def _stored(group: LocalGroup, topic: str, **properties: str) -> int:
    (sent,) = run(session_call(leader_address(group), CAROL, [SendMessageRequest(
        message=encode_message(Message(topic=topic, body=b"secret until later", properties=properties)))]))
    assert sent.code == ResponseCode.SUCCESS, sent.remark
    return WriteResponse.from_frame(sent).position


def _send_back(group: LocalGroup, position: int) -> tuple[int, str]:
    request = SendBackRequest(group="g1", position=position)
    (answer,) = run(session_call(leader_address(group), CAROL, [request]))
    return answer.code, answer.remark or ""


def test_a_readable_message_is_sent_back(group: LocalGroup) -> None:
    code, remark = _send_back(group, _stored(group, "orders"))
    assert code == ResponseCode.SUCCESS, remark


def test_a_delayed_message_is_not_sent_back_before_its_time(group: LocalGroup) -> None:
    code, remark = _send_back(group, _stored(group, "orders", DELAY="18"))  # level 18: 2 h
    assert code == ResponseCode.INVALID_ARGUMENT, (code, remark)
    assert "held" in remark, remark


def test_an_uncommitted_half_is_not_sent_back(group: LocalGroup) -> None:
    code, remark = _send_back(group, _stored(group, "orders", TRAN_MSG="true", PGROUP="carol-producers"))
    assert code == ResponseCode.INVALID_ARGUMENT, (code, remark)


def test_a_message_of_a_deleted_topic_is_not_sent_back(group: LocalGroup) -> None:
    position = _stored(group, "doomed")
    admin = Admin(servers=servers(group), credentials=ROOT)
    try:
        admin.delete_topic("doomed")
    finally:
        admin.close()
    code, remark = _send_back(group, position)
    assert code == ResponseCode.INVALID_ARGUMENT, (code, remark)
