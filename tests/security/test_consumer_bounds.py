"""Issue 25, row 6: what a HEARTBEAT may make the broker hold is bounded.

Before: a heartbeat created the ``%RETRY%group`` topic of every group it named that
subscribes to it, needing only ``sub`` on the group and without limit (a user with
``group:m-*`` made thousands), and DELETE_TOPIC refused those names, so nobody could remove
them; a heartbeat could name any number of groups and topics, and one connection register
any number of client ids. Now heartbeats and send-backs create at most
``MAX_RETRY_TOPICS_PER_USER`` retry topics per user (``broker.clients.retry_topics``), a group's
retry and dead-letter topics can be deleted with ``update`` on the group, and a heartbeat
names at most ``MAX_GROUPS`` groups of at most ``MAX_TOPICS`` topics, a connection holds
at most ``MAX_MEMBERS_PER_CONNECTION`` memberships. Three broker processes with ACLs on,
stopped by PID.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.clients.registry import MAX_GROUPS, MAX_MEMBERS_PER_CONNECTION, MAX_TOPICS
from broker.clients.retry_topics import MAX_RETRY_TOPICS_PER_USER
from client import Admin, Credentials
from protocol.consumer import HeartbeatRequest
from protocol.names import retry_topic
from protocol.remoting import ResponseCode
from protocol.topic import DeleteTopicRequest
from raftmq.local_group import LocalGroup
from tests.security.acl_cluster import ROOT, leader_address, prepared_acl_brokers, run, session_call
from tests.support.broker_group import servers
from tests.support.procs import wait_until

pytestmark = [pytest.mark.cluster]

MALLORY = Credentials("mallory", "mallory-password")


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGroup]:
    with prepared_acl_brokers(tmp_path_factory.mktemp("hb") / "g", ["orders"],
                              [(MALLORY, [("group:m-*", ["sub", "update"]), ("topic:*", ["sub"])])]) as g:
        yield g


def _retry_heartbeat(client_id: str, groups: list[str]) -> HeartbeatRequest:
    return HeartbeatRequest(client_id=client_id, subscriptions={g: (retry_topic(g),) for g in groups})


def _retry_topics(group: LocalGroup) -> list[str]:
    admin = Admin(servers=servers(group), credentials=ROOT)
    try:
        return sorted(t for t in admin.topics() if t.startswith("%RETRY%m-"))
    finally:
        admin.close()


def test_heartbeats_create_at_most_a_users_quota_of_retry_topics(group: LocalGroup) -> None:
    names = [f"m-{i}" for i in range(MAX_RETRY_TOPICS_PER_USER + 20)]
    beats = [_retry_heartbeat("c1", names[i:i + 10]) for i in range(0, len(names), 10)]
    answers = run(session_call(leader_address(group), MALLORY, beats))
    made = _retry_topics(group)
    assert len(made) <= MAX_RETRY_TOPICS_PER_USER, f"{len(made)} retry topics made by heartbeats"
    refused = answers[-1]
    assert refused.code == ResponseCode.NO_PERMISSION, (refused.code, refused.remark)
    assert f"{MAX_RETRY_TOPICS_PER_USER} retry topics" in (refused.remark or "")


def test_a_groups_retry_topic_can_be_deleted_with_update_on_the_group(group: LocalGroup) -> None:
    leader = leader_address(group)
    deleted, foreign = run(session_call(leader, MALLORY, [DeleteTopicRequest(topic="%RETRY%m-0"),
                                                          DeleteTopicRequest(topic="%RETRY%other")]))
    assert deleted.code == ResponseCode.SUCCESS, (deleted.code, deleted.remark)
    assert foreign.code == ResponseCode.NO_PERMISSION, (foreign.code, foreign.remark)
    # the topic lists come from any replica: a follower shows a change once it applied it
    wait_until(lambda: "%RETRY%m-0" not in _retry_topics(group), 10, what="the deleted retry topic gone")
    (again,) = run(session_call(leader, MALLORY, [_retry_heartbeat("c1", ["m-new"])]))
    assert again.code == ResponseCode.SUCCESS, again.remark  # the deleted one no longer counts
    wait_until(lambda: "%RETRY%m-new" in _retry_topics(group), 10, what="the new retry topic made")


def test_a_heartbeat_names_a_bounded_number_of_groups_and_topics(group: LocalGroup) -> None:
    wide = HeartbeatRequest(client_id="c2",
                            subscriptions={f"m-w{i}": ("orders",) for i in range(MAX_GROUPS + 1)})
    deep = HeartbeatRequest(client_id="c2",
                            subscriptions={"m-d": tuple(f"t-{i}" for i in range(MAX_TOPICS + 1))})
    answers = run(session_call(leader_address(group), MALLORY, [wide, deep]))
    assert [a.code for a in answers] == [ResponseCode.INVALID_ARGUMENT] * 2, [a.remark for a in answers]
    assert f"at most {MAX_GROUPS} groups" in (answers[0].remark or "")
    assert f"at most {MAX_TOPICS} topics" in (answers[1].remark or "")


def test_one_connection_holds_a_bounded_number_of_memberships(group: LocalGroup) -> None:
    beats = [HeartbeatRequest(client_id=f"c-{i}", subscriptions={"m-conn": ("orders",)})
             for i in range(MAX_MEMBERS_PER_CONNECTION + 5)]
    answers = run(session_call(leader_address(group), MALLORY, beats))
    assert all(a.code == ResponseCode.SUCCESS for a in answers[:MAX_MEMBERS_PER_CONNECTION])
    refused = answers[-1]
    assert refused.code == ResponseCode.INVALID_ARGUMENT, (refused.code, refused.remark)
    assert f"{MAX_MEMBERS_PER_CONNECTION} memberships" in (refused.remark or "")
