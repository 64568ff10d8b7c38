"""``raftmq replica forget`` (raftmq/replica_forget.py, issue 24): a stopped replica's data
directory -- a disk restored from a backup -- made a new storage of its group, so that it
votes only once the leader has recorded it; refused while the replica runs."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dledger.config import load_group_config
from dledger.raft.replicated_log import ReplicatedLog
from dledger.raft.storage_identity import IDENTITY_FILE, forget_storage, read_identity
from dledger.storage.hard_state import HardState, HardStateFile, probe
from raftmq.local_group import free_port
from raftmq.replica_cmd import main as replica_main
from tests.support.founding import founding
from tests.unit.test_replicated_log import leader_of


def node_toml(tmp_path: Path, raft_port: int, broker_port: int | None = None) -> Path:
    path = tmp_path / "n1.toml"
    broker = f'[broker]\nlisten = "127.0.0.1:{broker_port}"\n' if broker_port else ""
    path.write_text('[node]\nname = "n1"\ndata_dir = "n1"\n'
                    f'[group]\npeers = {{ n1 = "127.0.0.1:{raft_port}" }}\nsecret = "test-secret"\n'
                    f'[raft]\nsegment_bytes = 262144\n{broker}')
    return path


def test_forget_makes_a_new_joiner_and_moves_the_hard_state_aside(tmp_path: Path) -> None:
    data = tmp_path / "d"
    founding(load_group_config(node_toml(tmp_path, 1))).data_dir.rename(data)
    before = read_identity(data)
    state = HardStateFile(data / "raft-state")
    state.save(HardState(7, "n2", 1234))
    state.close()
    done = forget_storage(data, clock=0.0)
    assert before is not None and before.founder and done.was == before
    assert not done.now.founder and done.now.token.startswith("j-") and read_identity(data) == done.now
    assert done.hard_state_moved_to == data / "raft-state.forgotten-19700101T000000Z"
    assert probe(done.hard_state_moved_to) == ("ok", HardState(7, "n2", 1234)), "kept, not destroyed"
    assert probe(data / "raft-state") == ("ok", HardState(7, "n2", 0)), \
        "its term and vote kept (never two votes in one term), no commit hint"
    with pytest.raises(ValueError, match="nothing to forget"):
        forget_storage(tmp_path / "absent")


@pytest.mark.sockets
@pytest.mark.parametrize("port", ["raft", "broker"])
def test_forget_refuses_a_replica_that_runs_and_changes_nothing(
        tmp_path: Path, port: str, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as running:
        running.bind(("127.0.0.1", 0))
        running.listen()
        taken = running.getsockname()[1]
        raft, broker = (taken, free_port()) if port == "raft" else (free_port(), taken)
        toml = node_toml(tmp_path, raft, broker)
        data = founding(load_group_config(toml, other_sections=["broker"])).data_dir
        files = {name: (data / name).read_bytes() for name in (IDENTITY_FILE, "raft-state")}
        assert replica_main(["forget", "--config", str(toml)]) == 1
    said = capsys.readouterr().err
    assert "n1 seems to be running" in said and f"127.0.0.1:{taken} answers" in said, said
    assert "nothing was changed" in said
    assert {name: (data / name).read_bytes() for name in files} == files
    assert sorted(p.name for p in data.iterdir()) == sorted(files)


@pytest.mark.sockets
def test_after_forget_the_replica_opens_as_a_new_joiner_that_neither_votes_nor_stands(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    toml = node_toml(tmp_path, free_port())
    config = founding(load_group_config(toml))
    rlog = ReplicatedLog(config)
    try:
        leader_of({"n1": rlog})
        for i in range(5):
            rlog.propose(b"m%d" % i).result(timeout=10)
        founder, last = rlog.identity.token, rlog.commitlog.last_index
        assert rlog.status().voter is True
    finally:
        rlog.close()
    assert replica_main(["forget", "--config", str(toml)]) == 0
    said = capsys.readouterr().out
    reopened = ReplicatedLog(config)
    try:
        token = reopened.identity.token
        assert token.startswith("j-") and token != founder
        assert f"is now a new storage {token} (was {founder})" in said, said
        assert "moved aside to" in said and "votes only once recorded" in said
        assert reopened.forgot is None, "a deliberate new storage, not one found forgetful at start"
        assert reopened.commitlog.last_index == last, "its log is kept: it catches up from there"
        assert reopened.candidacy.reasons, "a new storage must neither vote nor stand"
        status = reopened.status()
        assert status.voter is False and status.storage == token
        assert founder in status.vote_refusal, status.vote_refusal
    finally:
        reopened.close()
