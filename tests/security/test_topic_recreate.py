"""Issue 15 row 8 (build item 6): delete a topic, create it again -- every group starts clean.

Found at 461c595: consumer offsets survived the delete, so a group that had committed 10
skipped the new topic's first 10 messages. Checked here against a broker process: after
the delete and the re-create the group's committed offset, another client's orderly lock,
an idempotent producer's sequence window and the group's pending retry of an old message
are all gone -- the group reads the new topic from its first message, another client
takes the queue's lock at once, the producer's sequence 0 is stored, and no message of the
old topic comes back through the group's retry topic.

Its transaction halves go too (issue 14, security gap b): a half message of the old topic
committed after the re-create must not appear in the new topic, and none stays held.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.deferred import EndTransactionRequest, EndTransactionResponse, SendBackRequest
from protocol.message_format import Message, encode_message
from protocol.offset import (
    CommitOffsetRequest,
    LockQueuesRequest,
    LockQueuesResponse,
    QueryOffsetRequest,
    QueryOffsetResponse,
)
from protocol.pull import PullRequest, PullResponse
from protocol.remoting import ResponseCode
from protocol.send import SendBatchRequest, SendBatchResponse
from protocol.topic import CreateTopicRequest, DeleteTopicRequest
from raftmq.local_group import LocalGroup
from tests.security.acl_cluster import run, session_call
from tests.security.namesrv_cluster import http_json
from tests.support.procs import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def _batch(n: int, producer: str | None = None) -> SendBatchRequest:
    return SendBatchRequest(records=tuple(
        encode_message(Message(topic="t", body=f"m{i}".encode(), queue_id=0, producer_id=producer,
                               sequence=i if producer else None)) for i in range(n)))


def test_a_topic_created_again_starts_clean_for_every_group(tmp_path: Path) -> None:
    broker = LocalGroup(tmp_path / "b", 1, module="broker", broker={"retry_delays": "1s"})
    try:
        broker.start()
        address = broker.nodes[broker.wait_leader(timeout=30)].http
        before = run(session_call(address, None, [
            CreateTopicRequest(topic="t", queues=1), _batch(10, producer="p1"),
            CommitOffsetRequest(group="g", topic="t", queue_id=0, offset=10),
            LockQueuesRequest(group="g", client_id="c1", topic="t", queues=(0,))]))
        assert [a.code for a in before] == [ResponseCode.SUCCESS] * 4, [a.remark for a in before]
        stored = SendBatchResponse.from_frame(before[1]).rows
        back = run(session_call(address, None, [SendBackRequest(group="g", position=stored[3].position)]))
        assert back[0].code == ResponseCode.SUCCESS, back[0].remark  # a retry of m3 is held for 1 s

        after = run(session_call(address, None, [
            DeleteTopicRequest(topic="t"), CreateTopicRequest(topic="t", queues=1),
            QueryOffsetRequest(group="g", topic="t", queue_id=0),
            LockQueuesRequest(group="g", client_id="c2", topic="t", queues=(0,)),
            _batch(1, producer="p1"), PullRequest(topic="t", queue_id=0, offset=0)]))
        assert [a.code for a in after] == [ResponseCode.SUCCESS] * 6, [a.remark for a in after]
        assert QueryOffsetResponse.from_frame(after[2]).offset == -1  # no committed offset survives
        assert LockQueuesResponse.from_frame(after[3]).queue_ids == (0,)  # c1's lock went
        assert SendBatchResponse.from_frame(after[4]).rows[0].queue_offset == 0  # p1's sequence 0 again
        assert [m.body for r in PullResponse.from_frame(after[5]).rows or () for m in r.messages()] == [b"m0"]

        wait_until(lambda: http_json(f"http://{address}/admin/cluster")[1]["held"]["delayed"] == 0, 20,
                   what="the held retry to be released or dropped")
        retry = run(session_call(address, None, [PullRequest(topic="%RETRY%g", queue_id=0, offset=0)]))[0]
        old = [] if retry.code != ResponseCode.SUCCESS else \
            [m.body for r in PullResponse.from_frame(retry).rows or () for m in r.messages()]
        assert old == [], f"the old topic's message came back through %RETRY%g: {old}"
    finally:
        broker.stop()


def test_a_deleted_topic_takes_its_transaction_halves_with_it(tmp_path: Path) -> None:
    broker = LocalGroup(tmp_path / "b", 1, module="broker")
    try:
        broker.start()
        address = broker.nodes[broker.wait_leader(timeout=30)].http
        half = encode_message(Message(topic="t", body=b"old half", queue_id=0,
                                      properties={"TRAN_MSG": "true", "PGROUP": "tx"}))
        before = run(session_call(address, None, [CreateTopicRequest(topic="t", queues=1),
                                                  SendBatchRequest(records=(half,))]))
        assert [a.code for a in before] == [ResponseCode.SUCCESS] * 2, [a.remark for a in before]
        position = SendBatchResponse.from_frame(before[1]).rows[0].position
        held = http_json(f"http://{address}/admin/cluster")[1]["held"]
        assert held["transaction_halves"] == 1, held

        recreated = run(session_call(address, None, [DeleteTopicRequest(topic="t"),
                                                     CreateTopicRequest(topic="t", queues=1)]))
        assert [a.code for a in recreated] == [ResponseCode.SUCCESS] * 2, [a.remark for a in recreated]
        held = http_json(f"http://{address}/admin/cluster")[1]["held"]
        assert held["transaction_halves"] == 0, held

        after = run(session_call(address, None, [EndTransactionRequest(position=position, commit=True),
                                                 PullRequest(topic="t", queue_id=0, offset=0)]))
        assert after[0].code == ResponseCode.SUCCESS, after[0].remark
        assert EndTransactionResponse.from_frame(after[0]).outcome == "already resolved"
        old = [] if after[1].code != ResponseCode.SUCCESS else \
            [m.body for r in PullResponse.from_frame(after[1]).rows or () for m in r.messages()]
        assert old == [], f"the old topic's transaction half was committed into the new topic: {old}"
    finally:
        broker.stop()
