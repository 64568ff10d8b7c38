"""RaftJournal: Raft's persistence and truncation rules at the pysyncobj contract.

The defect-1 regression tests replay the call sequence pysyncobj's follower makes
on an append_entries with a stale prevLogIdx (deleteEntriesFrom, then add of the
entries it already holds). They run against pysyncobj's own MemoryJournal too,
where they are expected to fail: that shows the test detects the defect.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.journal import MemoryJournal

from dledger.raft.codec import decode_command, encode_command, encode_payload_command
from dledger.raft.journal import CommittedEntryConflict, EntryNotStored, RaftJournal
from dledger.storage.commitlog import CommitLog
from dledger.storage.entry_format import EntryKind
from dledger.storage.hard_state import HardStateFile

NOOP = b"\x01"


def cmd(i: int) -> bytes:
    return encode_payload_command(f"payload-{i}".encode())


def make_journal(tmp_path: Path) -> RaftJournal:
    return RaftJournal(CommitLog(tmp_path / "log", segment_size=1 << 16), tmp_path / "state")


def fill(journal: Any, upto: int, term: int) -> None:
    """Entries 1..upto as a node in ``term`` appends them (term set first, as pysyncobj does)."""
    journal.setCurrentTerm(term, None)
    journal.add(NOOP, 1, 0)
    for i in range(2, upto + 1):
        journal.add(cmd(i), i, term)


def stale_resend(journal: Any, prev_idx: int, upto: int, term: int) -> None:
    """What pysyncobj's follower does for append_entries(prevLogIdx=prev_idx, entries to upto)."""
    first = journal[0][1]
    if len(journal[prev_idx - first:]) > 1:
        journal.deleteEntriesFrom(prev_idx + 1 - first)
    for i in range(prev_idx + 1, upto + 1):
        journal.add(cmd(i), i, term)


def indexes(journal: Any) -> list[int]:
    return [e[1] for e in journal[0:len(journal)]]


@pytest.fixture(params=["raftmq", pytest.param("stock", marks=pytest.mark.xfail(
    strict=True, reason="stock pysyncobj journal drops matching entries (defect 1)"))])
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "stock":
        return MemoryJournal()
    return make_journal(tmp_path)


def test_stale_prev_log_idx_keeps_matching_entries(journal: Any) -> None:
    fill(journal, 10, term=2)
    stale_resend(journal, prev_idx=5, upto=7, term=2)
    assert indexes(journal) == list(range(1, 11))


def test_heartbeat_with_stale_prev_log_idx_keeps_tail(journal: Any) -> None:
    fill(journal, 10, term=2)
    stale_resend(journal, prev_idx=4, upto=4, term=2)  # no entries: a heartbeat
    assert indexes(journal) == list(range(1, 11))


def test_entries_of_older_term_survive_a_term_bump(journal: Any) -> None:
    """A restarted follower raised the term with its own elections; its log is older."""
    fill(journal, 10, term=3)
    journal.setCurrentTerm(7, None)
    stale_resend(journal, prev_idx=3, upto=6, term=3)
    assert indexes(journal) == list(range(1, 11))


def test_conflicting_entry_truncates_from_there(tmp_path: Path) -> None:
    j = make_journal(tmp_path)
    fill(j, 10, term=2)
    j.setCurrentTerm(3, None)
    first = j[0][1]
    j.deleteEntriesFrom(6 + 1 - first)
    j.add(cmd(7), 7, 3)  # held with term 2: conflict
    assert indexes(j) == list(range(1, 8))
    assert j[-1][2] == 3
    assert j.conflict_truncations == 1


def test_committed_entry_is_never_overwritten(tmp_path: Path) -> None:
    j = make_journal(tmp_path)
    fill(j, 10, term=2)
    j.setRaftCommitIndex(8)
    assert j.committed_index == 8
    j.setCurrentTerm(3, None)
    with pytest.raises(CommittedEntryConflict):
        j.add(cmd(5), 5, 3)
    assert indexes(j) == list(range(1, 11))
    assert j[4][2] == 2


def test_committed_index_needs_confirmation_after_term_change(tmp_path: Path) -> None:
    """A stale tail must not count as committed just because leaderCommit covers it."""
    j = make_journal(tmp_path)
    fill(j, 10, term=2)
    j.setRaftCommitIndex(5)
    assert j.committed_index == 5
    j.setCurrentTerm(3, None)  # new leader; 6..10 are unconfirmed
    j.setRaftCommitIndex(10)  # pysyncobj: min(leaderCommit, lastIndex)
    assert j.committed_index == 5
    stale_resend(j, prev_idx=7, upto=8, term=2)  # the new leader has 8 at term 2
    assert j.committed_index == 8
    assert j.read_committed(1, 1 << 20)[-1].index == 8


def test_committed_index_never_decreases(tmp_path: Path) -> None:
    j = make_journal(tmp_path)
    fill(j, 6, term=1)
    j.setRaftCommitIndex(6)
    j.setRaftCommitIndex(3)
    assert j.committed_index == 6


def test_term_and_vote_survive_reopen(tmp_path: Path) -> None:
    j = make_journal(tmp_path)
    fill(j, 3, term=1)
    j.setCurrentTerm(5, "127.0.0.1:1234")
    j.commitlog.flush()
    j.commitlog.close()
    state = HardStateFile(tmp_path / "state").state
    assert state.term == 5 and state.voted_for == "127.0.0.1:1234"
    j2 = make_journal(tmp_path)
    assert j2.getCurrentTerm() == 5
    assert j2.getVotedForNodeId() == "127.0.0.1:1234"
    assert indexes(j2) == [1, 2, 3]


def test_current_term_is_at_least_last_entry_term(tmp_path: Path) -> None:
    j = make_journal(tmp_path)
    fill(j, 3, term=4)
    j.commitlog.close()
    assert make_journal(tmp_path).getCurrentTerm() == 4


def test_lazy_slice_reads_and_pickles_as_list(tmp_path: Path) -> None:
    import pickle

    j = make_journal(tmp_path)
    fill(j, 20, term=1)
    view = j[3:]
    assert len(view) == 17
    assert view[0][1] == 4 and view[-1][1] == 20
    assert [e[1] for e in view[:3]] == [4, 5, 6]
    restored = pickle.loads(pickle.dumps({"entries": view}))["entries"]
    assert isinstance(restored, list) and [e[1] for e in restored] == list(range(4, 21))
    assert restored[0][0] == cmd(4) or decode_command(restored[0][0]) == decode_command(cmd(4))


def test_command_round_trip() -> None:
    for command in (NOOP, cmd(1), b"\x02membership", b"\x00not-a-pickle"):
        kind, body = decode_command(command)
        assert decode_command(encode_command(kind, body)) == (kind, body)
    assert decode_command(cmd(9)) == (EntryKind.DATA, b"payload-9")
    assert decode_command(NOOP) == (EntryKind.NOOP, b"")


def test_an_entry_the_disk_cannot_take_is_not_appended_and_is_reported(tmp_path: Path) -> None:
    """A full disk: nothing of the entry is held, the disk flag is up, the node is told which
    command it was (the very object pysyncobj passed), and the next try after room came
    back appends it at the same index."""
    j = make_journal(tmp_path)
    fill(j, 3, term=1)
    append = j.commitlog.append
    told: list[bytes] = []
    j.on_not_stored = told.append

    def no_space(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    j.commitlog.append = no_space  # type: ignore[method-assign]
    j.disk.measure_free = lambda: 0
    command = cmd(4)
    with pytest.raises(EntryNotStored) as refused:
        j.add(command, 4, 1)
    assert refused.value.index == 4 and told and told[0] is command
    assert indexes(j) == [1, 2, 3] and j.confirmed_index == 3
    assert j.disk.full and "entry 4" in (j.disk.reason or "")
    j.commitlog.append = append  # type: ignore[method-assign]
    j.add(command, 4, 1)
    assert indexes(j) == [1, 2, 3, 4]


def test_another_append_error_is_raised_as_it_is(tmp_path: Path) -> None:
    j = make_journal(tmp_path)
    fill(j, 2, term=1)

    def broken(*args: object) -> int:
        raise OSError(errno.EIO, "Input/output error")

    j.commitlog.append = broken  # type: ignore[method-assign]
    with pytest.raises(OSError, match="Input/output"):
        j.add(cmd(3), 3, 1)
    assert not j.disk.full


@pytest.mark.parametrize(("held", "forgetting"), [(5, False), (7, False), (8, True), (12, True)])
def test_a_snapshot_install_over_a_log_that_was_not_behind_makes_the_replica_forgetful(
        tmp_path: Path, held: int, forgetting: bool) -> None:
    """A snapshot install restarts the log at the leader's retained start (index 8 here). A
    replica whose log ends before it forgets nothing it alone held; one whose log holds the
    reset index or beyond may drop entries it acknowledged (issue 24), so the journal says so
    (``on_forgetting``) before it resets -- and resets anyway, as pysyncobj answers the
    leader from the log it is left with."""
    j = make_journal(tmp_path)
    fill(j, held, term=2)
    j.setRaftCommitIndex(held - 1)
    told: list[str] = []
    j.on_forgetting = told.append
    j.stage_reset(8, 1 << 16)
    j.clear()
    assert bool(told) is forgetting, told
    if forgetting:
        assert told == [f"a snapshot install restarted its log at index 8 over entries it held up to {held}"]
    # entries never received: those between its commit index and the restart, if any
    assert j.log_resets == ([] if held - 1 >= 7 else [(held, 7)])
    assert len(j) == 0 and j.resume_hint == 9
    j.add(cmd(8), 8, 2)
    j.add(cmd(9), 9, 2)
    assert indexes(j) == [8, 9] and j.committed_index == max(8, held - 1), "it never moves backwards"
