"""Each end-of-scenario comparison fails below its minimum (``tests/chaos/replica_checks.py``).

Before issue 31 these comparisons passed on nothing: digests compared at 0 indexes (most
scenarios: digests are taken every 4,096 entries), ConsumeQueues over 0 units (a missing
folder read as no units), the offsets monitor with every error swallowed.
"""

from __future__ import annotations

from pathlib import Path

from tests.chaos.replica_checks import (
    compare_consume_queues,
    compare_digests,
    consume_queue_units,
    monitor_shortfall,
)

UNIT_A = b"a" * 40
UNIT_B = b"b" * 40


def test_digests_compared_at_no_index_are_a_problem() -> None:
    assert compare_digests({"n1": {}, "n2": {}, "n3": {}})[1] == [
        "state digests compared at 0 indexes (at least 1 required): {'n1': 0, 'n2': 0, 'n3': 0} digests held"]
    compared, problems = compare_digests({"n1": {"7": "x"}, "n2": {}, "n3": {}})  # one holder
    assert compared == 0 and problems


def test_digests_equal_at_one_index_pass_and_a_difference_is_named() -> None:
    assert compare_digests({"n1": {"7": "x"}, "n2": {"7": "x"}, "n3": {}}) == (1, [])
    compared, problems = compare_digests({"n1": {"7": "x", "9": "y"}, "n2": {"7": "x", "9": "z"}})
    assert compared == 2 and problems == ["state digests differ at index 9: {'n1': 'y', 'n2': 'z'}"]


def test_consume_queues_compared_over_no_unit_are_a_problem() -> None:
    assert compare_consume_queues({0: {"n1": None, "n2": None}, 1: {"n1": {}, "n2": {}}}) == (
        0, ["ConsumeQueues compared over 0 units (at least 1 required)"])


def test_a_missing_consume_queue_folder_is_a_difference() -> None:
    _, problems = compare_consume_queues({0: {"n1": {0: UNIT_A}, "n2": None}})
    assert problems[0] == "queue 0: ['n2'] hold no ConsumeQueue folder; the others hold units"


def test_units_are_compared_over_the_common_offsets() -> None:
    assert compare_consume_queues({0: {"n1": {0: UNIT_A, 1: UNIT_A}, "n2": {1: UNIT_A}}}) == (1, [])
    _, problems = compare_consume_queues({0: {"n1": {0: UNIT_A}, "n2": {0: UNIT_B}}})
    assert problems == ["queue 0: n2's ConsumeQueue differs from n1's at offset 0 (1 units)"]


def test_a_missing_folder_reads_as_none(tmp_path: Path) -> None:
    assert consume_queue_units(tmp_path / "absent") is None
    (tmp_path / "q").mkdir()
    assert consume_queue_units(tmp_path / "q") == {}


def test_a_monitor_that_read_nothing_is_a_problem_naming_its_last_error() -> None:
    problems = monitor_shortfall({"n1": 4, "n2": 0}, ["n1", "n2", "n3"], 0, {"n2": "TimeoutError()"})
    assert problems == [
        "the offsets monitor read n2 0 times (at least 1 required); last error: TimeoutError()",
        "the offsets monitor read n3 0 times (at least 1 required); last error: none",
        "the offsets monitor saw no committed offset: 'offsets never go back' checked nothing"]
    assert monitor_shortfall({"n1": 1}, ["n1"], 3, {}) == []
