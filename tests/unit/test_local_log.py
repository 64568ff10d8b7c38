"""LocalLog: the one-replica log without Raft the broker's unit tests run on. It must offer
what the broker uses of ReplicatedLog, with the same shapes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import msgspec
import pytest

from dledger.config import MAX_ENTRY_BYTES, GroupConfig
from dledger.errors import EntryTooLarge, ProposalRejected
from dledger.local_log import LocalLog
from dledger.log import Log
from dledger.membership import Change, Member
from dledger.raft.replicated_log import ReplicatedLog
from dledger.storage.entry_format import HEADER_SIZE
from raftmq.local_group import free_port
from tests.support.founding import founding

#: the surface the broker is written against (dledger/log.py)
LOG_SURFACE = sorted(set(Log.__annotations__) | {n for n in vars(Log) if not n.startswith("_")})


#: the keys of ``Log.status().to_json()`` in order: the start of a broker's and a log node's
#: ``/status`` (the documents tools, tests and the console read)
STATUS_KEYS = [
    "group", "node", "role", "term", "leader", "commit_index", "raft_commit_index", "first_index",
    "last_index", "write_position", "follower_match_index", "peers_connected", "last_fsync_time", "flush",
    "conflict_truncations", "lease_hand_offs", "followers_behind_retained_start", "log_resets", "members",
    "storage", "voter", "vote_refusal", "storages_catching_up", "forgot", "member", "members_changed_at",
    "pre_vote_rounds", "pre_vote_won", "snapshot_fetch", "disk", "disk_full_members",
]


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
        assert not log.is_leader and log.status().role == "follower"
    finally:
        log.close()
    reopened = LocalLog(GroupConfig(node="n1", peers={"n1": "127.0.0.1:1"}, data_dir=tmp_path))
    try:
        assert reopened.committed_index == 2 and reopened.read(2)[0].body == b"two"
        assert reopened.propose(b"three").result(1).index == 3
    finally:
        reopened.close()


def test_its_status_is_typed_and_its_json_keeps_the_documents_shape(tmp_path: Path) -> None:
    log = LocalLog(GroupConfig(node="n1", peers={"n1": "127.0.0.1:1"}, data_dir=tmp_path))
    try:
        appended = log.propose(b"one").result(1)
        status = log.status()
        assert (status.role, status.term, status.commit_index, status.last_index) == ("leader", 1, 1, 1)
        assert status.write_position > appended.position and status.member and status.voter
        with pytest.raises(AttributeError):
            status.term = 2  # type: ignore[misc]  # frozen: a caller cannot change what it reports
        doc = json.loads(json.dumps(status.to_json()))
        assert list(doc) == STATUS_KEYS
        assert doc["members"] == {"n1": {"raft": "127.0.0.1:1", "client": "", "storage": ""}}
        assert doc["disk"]["full"] is False and doc["follower_match_index"] == {}
        reset = msgspec.structs.replace(status, log_resets=[(3, 5)])
        assert reset.to_json()["log_resets"] == [[3, 5]]  # as the JSON lists of before
    finally:
        log.close()


def test_its_reader_reads_records_by_position(tmp_path: Path) -> None:
    log = LocalLog(GroupConfig(node="n1", peers={"n1": "127.0.0.1:1"}, data_dir=tmp_path))
    try:
        first, second = (log.propose(body).result(1) for body in (b"one", b"two"))
        reader = log.reader
        assert (reader.start_position, reader.last_index) == (0, 2)
        assert reader.write_position == second.position + reader.record_size_of(2)
        assert reader.entry_containing(second.position + 5) == (2, second.position)
        assert reader.read_at(second.position + HEADER_SIZE, 3) == b"two"
        assert [e.body for e in reader.entries(1, 1 << 20)] == [b"one", b"two"]
        assert reader.entry(first.index).body == b"one"
        assert reader.entry_containing(reader.write_position) is None
        assert [s.start for s in reader.segments()] == [0]
    finally:
        log.close()


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
        assert list(local.status().to_json()) == list(real.status().to_json()) == STATUS_KEYS
        assert local.status().role == real.status().role == "leader"
    finally:
        local.close()
        real.close()
