"""Each log-level checker names each defect it exists for: a log (or applied log, or pair of
replicas) with exactly that defect, and the Violation or problem that names it.

``check_history``, ``check_identical``, ``check_applied`` (``tests/support/history.py``) and
``log_differences`` (``tests/support/broker_log.py``) judge the multi-process and chaos
tests; ``test_every_check_has_a_negative_test`` keeps the cases below in step with the
checks each function makes.
"""

from __future__ import annotations

import inspect
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dledger.process.recording_machine import GAP_KIND
from dledger.storage.entry_format import Entry, EntryKind
from tests.support.broker_log import compare_logs, log_differences
from tests.support.history import History, Violation, check_applied, check_history, check_identical

Row = list[Any]


def _rows(n: int = 3) -> list[Row]:
    return [[i, 1, 0, 100 * i, f"p{i}".encode()] for i in range(1, n + 1)]


def _history(rows: list[Row]) -> History:
    h = History()
    for index, *_, body in rows:
        h.ok(body, index)
    return h


def _records(rows: list[Row]) -> list[tuple[int, int, int, int]]:
    return [(r[0], r[1], r[2], zlib.crc32(r[4])) for r in rows]


# -- check_history: one replica's log against what clients were told ---------------------------
HISTORY_CASES: dict[str, tuple[Callable[[list[Row], History], None], str]] = {
    "stored twice": (lambda rows, h: rows.append([4, 1, 0, 400, b"p1"]), "stored more than once"),
    "acknowledged and lost": (lambda rows, h: h.ok(b"p9", 9), "acknowledged payloads lost"),
    "not at its acknowledged index": (lambda rows, h: h.ok(b"p2", 3), "not at their acknowledged index"),
    "failed but stored": (lambda rows, h: h.fail(b"p3"), "definitely-failed payloads were stored"),
    "indexes not contiguous": (lambda rows, h: rows.append([5, 1, 1, 500, b"admin"]), "not contiguous"),
}


@pytest.mark.parametrize("case", sorted(HISTORY_CASES))
def test_check_history_names_each_defect(case: str) -> None:
    rows = _rows()
    history = _history(rows)
    check_history(rows, history)  # clean
    breakage, words = HISTORY_CASES[case]
    breakage(rows, history)
    with pytest.raises(Violation, match=words):
        check_history(rows, history)


# -- check_identical: the replicas' committed logs ------------------------------------------------
IDENTICAL_CASES: dict[str, tuple[Callable[[list[Row]], None], str]] = {
    "a replica shorter": (lambda rows: rows.pop(), "has 2 committed entries, n1 3"),
    "a row differs": (lambda rows: rows.__setitem__(1, [2, 2, 0, 200, b"p2"]), "differs from n1 at index 2"),
}


@pytest.mark.parametrize("case", sorted(IDENTICAL_CASES))
def test_check_identical_names_each_defect(case: str) -> None:
    other = _rows()
    check_identical({"n1": _rows(), "n2": other})
    breakage, words = IDENTICAL_CASES[case]
    breakage(other)
    with pytest.raises(Violation, match=words):
        check_identical({"n1": _rows(), "n2": other})


# -- check_applied: a replica's applied log against its committed entries ---------------------------
APPLIED_CASES: dict[str, tuple[Callable[[list[tuple[int, int, int, int]]], None], str]] = {
    "nothing applied": (lambda recs: recs.clear(),
                        "applied up to index 0 \\(0 records\\), committed up to 3"),
    "stops short of the commit": (lambda recs: recs.pop(), "applied up to index 2"),
    "an index applied out of order": (lambda recs: recs.insert(1, recs.pop(2)), "applied index 3 where 2"),
    "an entry applied with other bytes": (lambda recs: recs.__setitem__(1, (2, 1, 0, 7)),
                                          "applied entry 2 differs"),
}


@pytest.mark.parametrize("case", sorted(APPLIED_CASES))
def test_check_applied_names_each_defect(case: str) -> None:
    rows = _rows()
    records = _records(rows)
    check_applied(records, rows)
    breakage, words = APPLIED_CASES[case]
    breakage(records)
    with pytest.raises(Violation, match=words):
        check_applied(records, rows)


def test_check_applied_accepts_a_retention_gap_that_reaches_the_commit() -> None:
    rows = _rows()[1:]
    check_applied([(1, 0, GAP_KIND, 0), *_records(rows)], rows)


# -- log_differences: the broker replicas' CommitLogs after the final SIGKILL ----------------------------
def _entries(n: int = 3) -> list[Entry]:
    return [Entry(i, 1, EntryKind.DATA, f"b{i}".encode(), 64 * i) for i in range(1, n + 1)]


def _dirs(tmp_path: Path, names: dict[str, bytes]) -> dict[str, Path]:
    dirs = {}
    for replica, content in names.items():
        d = tmp_path / replica
        (d / "commitlog").mkdir(parents=True)
        (d / "commitlog" / f"{0:020d}").write_bytes(content)
        dirs[replica] = d
    return dirs


def test_log_differences_names_each_defect(tmp_path: Path) -> None:
    same = _dirs(tmp_path / "same", {"n1": b"x", "n2": b"x"})
    assert log_differences({"n1": _entries(), "n2": _entries()}, same) == []
    assert log_differences({"n1": _entries(), "n2": _entries(2)}) == ["n2 holds entries 1..2, n1 1..3"]
    changed = _entries()
    changed[1] = Entry(2, 2, EntryKind.DATA, b"b2", 128)
    assert log_differences({"n1": _entries(), "n2": changed})[0].startswith("n2 differs from n1 at index 2")
    bytes_differ = _dirs(tmp_path / "bytes", {"n1": b"x", "n2": b"y"})
    assert log_differences({"n1": _entries(), "n2": _entries()}, bytes_differ) == [
        f"segment files ['{0:020d}'] of n2 are not byte-identical to n1's"]
    names_differ = _dirs(tmp_path / "names", {"n1": b"x", "n2": b"x"})
    (names_differ["n2"] / "commitlog" / f"{1 << 20:020d}").write_bytes(b"z")
    assert log_differences({"n1": _entries(), "n2": _entries()}, names_differ)[0].startswith(
        "n2's segment files")


def test_log_differences_compares_something(tmp_path: Path) -> None:
    """No comparison passes on nothing (issue 31 row 2, G6): empty logs are not identical logs,
    and a byte comparison that found no segment file to compare compared nothing."""
    assert log_differences({"n1": [], "n2": []}) == ["no log entry to compare: every replica's log is empty"]
    empty = {n: tmp_path / "empty" / n for n in ("n1", "n2")}
    for d in empty.values():
        (d / "commitlog").mkdir(parents=True)
    assert log_differences({"n1": _entries(), "n2": _entries()}, empty) == [
        "no segment file to compare byte for byte"]


def _restarted_dirs(tmp_path: Path, tail: bytes) -> dict[str, Path]:
    """n1 holds segment 0 whole; n2 restarted its log at position 128 (retention: the bytes
    before it are zeros) and holds the same bytes from there, with ``tail`` last."""
    n1 = b"A" * 128 + b"B" * 64 + b"tail"
    return _dirs(tmp_path, {"n1": n1, "n2": bytes(128) + b"B" * 64 + tail})


def test_log_differences_over_the_common_range_compares_the_first_common_file_from_its_start(
        tmp_path: Path) -> None:
    """With retention the first segment every replica holds may begin on one of them mid-file:
    it is compared from the first common entry on (before, it was skipped, and a log whose
    only common segment was that one compared no byte)."""
    logs = {"n1": _entries(), "n2": _entries()[1:]}  # n2's log starts at entry 2, position 128
    result = compare_logs(logs, _restarted_dirs(tmp_path / "same", b"tail"), common_range=True)
    assert result.problems == [] and (result.entries, result.files) == (2, 1)
    differ = compare_logs(logs, _restarted_dirs(tmp_path / "differ", b"TAIL"), common_range=True)
    assert differ.problems == [f"segment files ['{0:020d}'] of n2 are not byte-identical to n1's "
                               "(from the first common entry at position 128 on)"]


def test_every_check_has_a_negative_test() -> None:
    """One case per ``raise Violation`` / ``problems.append`` of each checker."""
    def count(fn: Callable[..., Any], what: str) -> int:
        return inspect.getsource(fn).count(what)
    assert count(check_history, "raise Violation(") == len(HISTORY_CASES)
    assert count(check_identical, "raise Violation(") == len(IDENTICAL_CASES)
    assert count(check_applied, "raise Violation(") == len(APPLIED_CASES) - 1  # short/empty: one check
    assert count(compare_logs, "problems.append(") == 6  # the four asserts above, the two minimums
