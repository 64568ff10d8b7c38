"""LocalLog: the one-replica log without Raft the broker's unit tests run on. It must offer
what the broker uses of ReplicatedLog, with the same shapes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dledger.config import MAX_ENTRY_BYTES, GroupConfig
from dledger.errors import EntryTooLarge, ProposalRejected
from dledger.local_log import LocalLog
from dledger.log import Log
from dledger.membership import Change, Member
from dledger.raft.replicated_log import ReplicatedLog
from raftmq.local_group import free_port
from tests.support.founding import founding

#: the surface the broker is written against (dledger/log.py)
LOG_SURFACE = sorted(set(Log.__annotations__) | {n for n in vars(Log) if not n.startswith("_")})


def test_proposals_commit_at_once_and_read_back_in_order(tmp_path: Path) -> None:
    log = LocalLog(GroupConfig(node="n1", peers={"n1": "127.0.0.1:1"}, data_dir=tmp_path))
    try:
        first = log.propose(b"one").result(1)
        second = log.propose(b"two").result(1)
        assert (first.index, second.index) == (1, 2) and second.position > first.position
        assert log.wait_committed(2, 0) and log.committed_index == 2
        assert [e.body for e in log.read(1)] == [b"one", b"two"]
        assert log.read(3) == []
        with pytest.raises(EntryTooLarge):
            log.propose(b"x" * (MAX_ENTRY_BYTES + 1))
        with pytest.raises(ProposalRejected):
            log.change_membership(Change("add", Member("n2", "127.0.0.1:2")))
        assert log.is_leader and log.leader == "n1"
        log.stand_for_election(False)
        assert not log.is_leader and log.status()["role"] == "follower"
    finally:
        log.close()
    reopened = LocalLog(GroupConfig(node="n1", peers={"n1": "127.0.0.1:1"}, data_dir=tmp_path))
    try:
        assert reopened.committed_index == 2 and reopened.read(2)[0].body == b"two"
        assert reopened.propose(b"three").result(1).index == 3
    finally:
        reopened.close()


@pytest.mark.sockets
def test_it_offers_what_the_broker_uses_with_the_same_status_shape(tmp_path: Path) -> None:
    local = LocalLog(GroupConfig(node="n1", peers={"n1": "127.0.0.1:1"}, data_dir=tmp_path / "a"))
    real = ReplicatedLog(founding(GroupConfig(node="n1", peers={"n1": f"127.0.0.1:{free_port()}"},
                                     data_dir=tmp_path / "b", secret="t")))
    try:
        assert len(LOG_SURFACE) > 15
        for name in LOG_SURFACE:
            assert hasattr(local, name) and hasattr(real, name), name
        deadline = time.monotonic() + 10
        while not real.is_leader:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert set(local.status()) == set(real.status())
        assert local.status()["role"] == real.status()["role"] == "leader"
    finally:
        local.close()
        real.close()
