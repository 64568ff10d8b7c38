"""``broker.remoting.dispatch.answer``: what a client reads when a processor's handler
raises, in memory (no server, no socket)."""

from __future__ import annotations

import asyncio

import pytest

from broker.remoting.dispatch import answer
from broker.store.entry_batch import MessageTooLarge
from dledger.errors import DiskFull, NoLeader, NotLeader, OutcomeUnknown, ProposalRejected
from protocol.names import InvalidName
from protocol.remoting import Frame, FrameError, RequestCode, ResponseCode
from protocol.wire import NotLeaderResponse

REQUEST = Frame.request(RequestCode.SEND_MESSAGE, opaque=41)


def answered(error: Exception, leader_address: dict[str, str] | None = None) -> Frame:
    async def handler(frame: Frame) -> Frame:
        raise error

    addresses = leader_address or {}
    return asyncio.run(answer(REQUEST, handler, addresses.get))


def test_a_handlers_response_is_the_answer() -> None:
    async def handler(frame: Frame) -> Frame:
        return frame.response(ResponseCode.SUCCESS, body=b"done")

    reply = asyncio.run(answer(REQUEST, handler, lambda _name: None))
    assert (reply.code, reply.opaque, reply.body) == (ResponseCode.SUCCESS, 41, b"done")
    assert reply.is_response


@pytest.mark.parametrize(("error", "code"), [
    (InvalidName("topic", "a b", "names are letters, digits, - and _"), ResponseCode.INVALID_NAME),
    (MessageTooLarge("a message of 9 MiB"), ResponseCode.MESSAGE_TOO_LARGE),
    (NoLeader("the group has no leader right now"), ResponseCode.NO_LEADER),
    (OutcomeUnknown("the leader changed"), ResponseCode.OUTCOME_UNKNOWN),
    (DiskFull(["b"], "b's disk is full"), ResponseCode.DISK_FULL),
    (ProposalRejected("refused"), ResponseCode.SYSTEM_BUSY),  # any other ProposeError
])
def test_each_known_error_has_its_code_and_says_why(error: Exception, code: ResponseCode) -> None:
    reply = answered(error)
    assert (reply.code, reply.opaque, reply.remark) == (code, 41, str(error))


def test_a_frame_error_keeps_its_own_code_and_message() -> None:
    reply = answered(FrameError(ResponseCode.INVALID_ARGUMENT, "queueId must be an int"))
    assert (reply.code, reply.remark) == (ResponseCode.INVALID_ARGUMENT, "queueId must be an int")


def test_not_leader_names_the_leader_and_its_client_address() -> None:
    reply = answered(NotLeader("b", "127.0.0.1:7002"), {"b": "127.0.0.1:8002"})
    assert reply.code == ResponseCode.NOT_LEADER
    body = NotLeaderResponse.from_frame(reply)
    assert (body.leader, body.leader_address) == ("b", "127.0.0.1:8002")


def test_an_unexpected_error_is_a_system_error_that_hides_its_text(caplog: pytest.LogCaptureFixture) -> None:
    reply = answered(RuntimeError("secret internals"))
    assert reply.code == ResponseCode.SYSTEM_ERROR
    assert "secret" not in reply.remark
    assert "secret internals" in caplog.text  # logged for the operator
