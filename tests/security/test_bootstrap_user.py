"""Issue 25, row 9: a deleted bootstrap super user stays deleted while another super user
exists.

Before: the leader proposed the bootstrap file's user whenever the users table lacked its
name, so an operator who deleted ``root`` (having made super user ``ops``) found it back
within a second. Now it is proposed only while no super user exists (the group's way in).
Three broker processes with ACLs on, stopped by PID.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from client import Admin, Credentials
from protocol.acl import ListUsersRequest, UsersResponse
from protocol.remoting import ResponseCode
from raftmq.local_group import LocalGroup
from tests.security.acl_cluster import ROOT, acl_brokers, leader_address, run, session_call
from tests.support.broker_group import servers
from tests.support.procs import wait_until

pytestmark = [pytest.mark.cluster]

OPS = Credentials("ops", "ops-password")


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGroup]:
    with acl_brokers(tmp_path_factory.mktemp("boot") / "g") as g:
        yield g


def _users(group: LocalGroup, who: Credentials) -> dict[str, bool]:
    (answer,) = run(session_call(leader_address(group), who, [ListUsersRequest()]))
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return {row.user: row.super for row in UsersResponse.from_frame(answer).users}


def test_a_deleted_bootstrap_user_stays_deleted_while_another_super_user_exists(group: LocalGroup) -> None:
    admin = Admin(servers=servers(group), credentials=ROOT)
    try:
        admin.put_user(OPS.user, OPS.password, super_user=True)
    finally:
        admin.close()
    ops = Admin(servers=servers(group), credentials=OPS)
    try:
        ops.delete_user(ROOT.user)
        time.sleep(3.0)  # the bootstrap check runs every second
        assert ROOT.user not in _users(group, OPS), "the deleted bootstrap user came back"
        ops.delete_user(OPS.user)  # no super user left: the bootstrap file is the way in again
    finally:
        ops.close()
    wait_until(lambda: _root_back(group), 15, what="root back with no super user left")


def _root_back(group: LocalGroup) -> bool:
    try:
        return ROOT.user in _users(group, ROOT)
    except AssertionError:  # not back yet: its login fails
        return False
