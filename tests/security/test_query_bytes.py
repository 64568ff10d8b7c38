"""Issue 25, row 9: a QUERY_MESSAGE answer is bounded in bytes.

Before: a query by key answered up to 256 rows whatever their size -- one key on many large
messages made the broker build an answer of hundreds of MiB (256 of 4 MiB: 1 GiB), and read
four times as many candidates. Now the rows stop at ``QUERY_BODY_BYTES`` (the first row
always goes), and the candidates read stop at four times that. Three broker processes,
stopped by PID.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.processors.query import QUERY_BODY_BYTES
from protocol.message_format import Message, encode_message
from protocol.query import QueryMessageRequest, QueryResponse
from protocol.remoting import ResponseCode
from protocol.send import SendMessageRequest
from raftmq.local_group import LocalGroup
from tests.security.acl_cluster import leader_address, run, session_call
from tests.support.broker_group import create_topic, running_brokers

pytestmark = [pytest.mark.cluster]

BODY = 900 * 1024


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGroup]:
    base: Path = tmp_path_factory.mktemp("query") / "g"
    with running_brokers(base, segment_bytes=64 << 20) as g:
        create_topic(g, "big", 1)
        yield g


def test_a_query_answer_is_bounded_in_bytes(group: LocalGroup) -> None:
    count = QUERY_BODY_BYTES // BODY + 3
    sends = [SendMessageRequest(message=encode_message(Message(topic="big", body=bytes([i]) * BODY,
                                                               keys=("same-key",))))
             for i in range(count)]
    answers = run(session_call(leader_address(group), None, sends))
    assert all(a.code == ResponseCode.SUCCESS for a in answers), [a.remark for a in answers]
    (found,) = run(session_call(leader_address(group), None, [QueryMessageRequest(key="same-key",
                                                                                  max_results=256)]))
    assert found.code == ResponseCode.SUCCESS, found.remark
    rows = QueryResponse.from_frame(found).rows
    total = sum(len(r.message) for r in rows)
    assert 1 <= len(rows) < count and total <= QUERY_BODY_BYTES, (len(rows), total)
