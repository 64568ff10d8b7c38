"""Storage identities and the voter rule without a cluster (issue 24): who may vote, grant a
pre-vote, stand or be counted, from the membership's records and the replica's own
identity and hard state."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from dledger.membership import BIND_FUNC_ID, Change, Member, MemberHistory, decode_changes, encode_bindings
from dledger.raft.storage_identity import (
    IDENTITY_FILE,
    StorageIdentity,
    StorageIdentityError,
    format_founder,
    open_identity,
    read_identity,
)
from dledger.raft.storage_rule import counts, self_vote_refusal
from dledger.storage.hard_state import HardState, HardStateFile

F = "f-" + "11" * 16
F2 = "f-" + "22" * 16
J = "j-" + "33" * 16
J2 = "j-" + "44" * 16


@pytest.mark.parametrize(("recorded", "token", "committed", "expected"), [
    ("", F, False, True),      # the group's first storages, before any record
    ("", J, True, False),      # a new storage: fed the log, then recorded
    (F, F, False, True),       # a founder's record only names the storage that counted
    (F, F2, True, False),      # a founder re-formatted under the same name
    (F, J, True, False),       # a replaced host, before its record
    (J, J, False, False),      # recorded, not committed yet
    (J, J, True, True),        # recorded and committed
    (J, J2, True, False),      # replaced again
    (J, "", True, False),      # an answer that says no storage
])
def test_who_counts(recorded: str, token: str, committed: bool, expected: bool) -> None:
    record = Member("n2", "h:1", "", recorded)
    assert counts(record, token, committed) is expected
    refusal = self_vote_refusal(record, token, committed)
    assert (refusal is None) is expected, refusal


def test_an_answer_without_a_token_is_an_older_version_counted_only_while_nothing_is_recorded() -> None:
    assert counts(Member("n2", "h:1"), None, True) is True  # a rolling upgrade goes on committing
    assert counts(Member("n2", "h:1", "", F), None, True) is False


def test_a_stranger_counts_for_nothing_and_a_non_member_is_held_back_elsewhere() -> None:
    assert counts(None, F, True) is False
    assert self_vote_refusal(None, J, True) is None  # NOT_A_MEMBER holds it back


def test_the_refusal_says_why() -> None:
    assert "new to the group" in str(self_vote_refusal(Member("n2", "h:1"), J, True))
    assert "not the one the group recorded" in str(self_vote_refusal(Member("n2", "h:1", "", F), J, True))
    assert "not committed yet" in str(self_vote_refusal(Member("n2", "h:1", "", J), J, False))


def test_identity_file_round_trip_and_damage(tmp_path: Path) -> None:
    identity = StorageIdentity(bytes(range(16)), founder=True)
    assert identity.token == "f-" + bytes(range(16)).hex()
    assert identity.encode().hex() == "524d53490146" + bytes(range(16)).hex() + identity.encode()[-4:].hex()
    assert StorageIdentity.decode(identity.encode()) == identity
    damaged = bytearray(identity.encode())
    damaged[8] ^= 1
    assert StorageIdentity.decode(bytes(damaged)) is None
    assert StorageIdentity.decode(identity.encode()[:-1]) is None


def _dir_with(tmp_path: Path, *, identity: StorageIdentity | None, hard: bool) -> Path:
    d = tmp_path / "d"
    d.mkdir()
    if hard:
        HardStateFile(d / "raft-state").close()
    if identity is not None:
        (d / IDENTITY_FILE).write_bytes(identity.encode())
    return d


def test_open_keeps_an_intact_storage(tmp_path: Path) -> None:
    mine = StorageIdentity.new(founder=True)
    d = _dir_with(tmp_path, identity=mine, hard=True)
    assert open_identity(d, hard_state="ok", log_holds_entries=True, forgot=None) == (mine, None)


def test_an_empty_directory_without_init_is_a_new_joiner(tmp_path: Path) -> None:
    d = _dir_with(tmp_path, identity=None, hard=False)
    identity, why = open_identity(d, hard_state="absent", log_holds_entries=False, forgot=None)
    assert not identity.founder and why is None and read_identity(d) == identity


def test_a_directory_from_before_identities_is_its_founder(tmp_path: Path) -> None:
    d = _dir_with(tmp_path, identity=None, hard=True)
    identity, why = open_identity(d, hard_state="ok", log_holds_entries=True, forgot=None)
    assert identity.founder and why is None


@pytest.mark.parametrize(("hard", "entries", "forgot", "said"), [
    ("absent", True, None, "hard state"),       # hard state deleted
    ("corrupt", True, None, "hard state"),      # both copies damaged
    ("ok", True, "repair cut it", "repair cut it"),
])
def test_a_replica_that_may_have_forgotten_becomes_a_new_joiner(
        tmp_path: Path, hard: str, entries: bool, forgot: str | None, said: str) -> None:
    mine = StorageIdentity.new(founder=True)
    d = _dir_with(tmp_path, identity=mine, hard=hard == "ok")
    identity, why = open_identity(d, hard_state=hard, log_holds_entries=entries, forgot=forgot)
    assert identity != mine and not identity.founder and said in str(why)
    assert read_identity(d) == identity  # written before the replica speaks


def test_no_identity_no_hard_state_but_a_log_is_a_forgetful_replica(tmp_path: Path) -> None:
    d = _dir_with(tmp_path, identity=None, hard=False)
    identity, why = open_identity(d, hard_state="absent", log_holds_entries=True, forgot=None)
    assert not identity.founder and why is not None


def test_init_formats_only_an_empty_directory(tmp_path: Path) -> None:
    founder = format_founder(tmp_path / "new")
    assert founder.founder and read_identity(tmp_path / "new") == founder
    assert (tmp_path / "new" / "raft-state").exists()  # founded means remembered from here on
    # and starting it keeps that identity
    opened = open_identity(tmp_path / "new", hard_state="ok", log_holds_entries=False, forgot=None)
    assert opened == (founder, None)
    with pytest.raises(StorageIdentityError, match="already formatted"):
        format_founder(tmp_path / "new")
    used = tmp_path / "used"
    (used / "commitlog").mkdir(parents=True)
    (used / "commitlog" / "00000000000000000000").write_bytes(b"x")
    with pytest.raises(StorageIdentityError, match="empty directory without init"):
        format_founder(used)


def test_a_bind_entry_records_storages_and_when(tmp_path: Path) -> None:
    command = b"\x00" + pickle.dumps((BIND_FUNC_ID, (encode_bindings({"n2": J, "n1": F}),)), protocol=5)
    changes = decode_changes(command)
    assert [(c.op, c.member.name, c.member.storage) for c in changes] == [("bind", "n1", F),
                                                                           ("bind", "n2", J)]
    assert decode_changes(b"\x00" + pickle.dumps((0, (b"data",)))) == []  # a DATA command: not ours
    history = MemberHistory(tmp_path / "members", {"n1": Member("n1", "h:1"), "n2": Member("n2", "h:2")}, 0)
    history.record(5, changes)
    assert history.current()["n2"] == Member("n2", "h:2", "", J)
    assert history.storage_recorded_at("n2") == 5 and history.storage_recorded_at("n3") == -1
    history.record(9, Change("add", Member("n3", "h:3", "c:3", J2)))
    assert history.storage_recorded_at("n2") == 5 and history.storage_recorded_at("n3") == 9
    reopened = MemberHistory(tmp_path / "members", {}, 9)
    assert reopened.current()["n2"].storage == J and reopened.storage_recorded_at("n2") == 5
    history.truncate_from(5)
    assert history.current()["n2"].storage == "" and history.storage_recorded_at("n2") == 0
    assert Member.parse("n3 h:3 - " + J) == Member("n3", "h:3", "", J)


def test_hard_state_probe_changes_nothing(tmp_path: Path) -> None:
    from dledger.storage.hard_state import probe
    assert probe(tmp_path / "none") == ("absent", None)
    f = HardStateFile(tmp_path / "hs")
    f.save(HardState(3, "n1", 40))
    f.close()
    assert probe(tmp_path / "hs") == ("ok", HardState(3, "n1", 40))
    (tmp_path / "bad").write_bytes(b"\xff" * 8192)
    assert probe(tmp_path / "bad") == ("corrupt", None)
    assert (tmp_path / "bad").read_bytes() == b"\xff" * 8192
