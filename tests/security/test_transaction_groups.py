"""Issue 25, row 5: a transaction half belongs to its producer group.

Before: END_TRANSACTION needed only ``pub`` on the half's topic, so user B could commit or
roll back user A's half (finding its position through the "already resolved" answer), and
the half's PGROUP property was never authorized, so B could aim CHECK_TRANSACTION -- with
the message -- at A's producers. Now ending a half needs ``pub`` on its producer group too
(one remark for a foreign half and for no half at all), and sending a half needs ``pub`` on
the group it names. Three broker processes with ACLs on, stopped by PID.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from client import Credentials
from protocol.deferred import EndTransactionRequest, EndTransactionResponse
from protocol.message_format import Message, encode_message
from protocol.remoting import ResponseCode
from protocol.send import SendMessageRequest, WriteResponse
from raftmq.local_group import LocalGroup
from tests.security.acl_cluster import leader_address, prepared_acl_brokers, run, session_call

pytestmark = [pytest.mark.cluster]

ALICE = Credentials("alice", "alice-password")
BOB = Credentials("bob", "bob-password")


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGroup]:
    users = [(who, [("topic:payments", ["pub", "sub"]), (f"group:{who.user}-producers", ["pub"])])
             for who in (ALICE, BOB)]
    with prepared_acl_brokers(tmp_path_factory.mktemp("tx") / "g", ["payments"], users) as g:
        yield g


def half(group: str) -> SendMessageRequest:
    return SendMessageRequest(message=encode_message(Message(
        topic="payments", body=b"pay 100", properties={"TRAN_MSG": "true", "PGROUP": group})))


def test_another_users_half_can_be_neither_committed_nor_rolled_back(group: LocalGroup) -> None:
    address = leader_address(group)
    (sent,) = run(session_call(address, ALICE, [half("alice-producers")]))
    assert sent.code == ResponseCode.SUCCESS, sent.remark
    position = WriteResponse.from_frame(sent).position
    foreign, nothing = run(session_call(address, BOB, [EndTransactionRequest(position=position, commit=True),
                                                       EndTransactionRequest(position=position + 7,
                                                                             commit=True)]))
    assert foreign.code == ResponseCode.NO_PERMISSION, (foreign.code, foreign.remark)
    assert (nothing.code, nothing.remark) == (foreign.code, foreign.remark)  # no probing for halves
    (own,) = run(session_call(address, ALICE, [EndTransactionRequest(position=position, commit=False)]))
    assert own.code == ResponseCode.SUCCESS, own.remark
    assert EndTransactionResponse.from_frame(own).outcome != "already resolved"


def test_a_half_cannot_name_another_users_producer_group(group: LocalGroup) -> None:
    address = leader_address(group)
    (aimed,) = run(session_call(address, BOB, [half("alice-producers")]))
    assert aimed.code == ResponseCode.NO_PERMISSION, (aimed.code, aimed.remark)
    assert "pub on group:alice-producers" in aimed.remark
    (own,) = run(session_call(address, BOB, [half("bob-producers")]))
    assert own.code == ResponseCode.SUCCESS, own.remark


