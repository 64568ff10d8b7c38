"""Replicas compare state digests at equal indexes; the one a majority disagrees with is divergent."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from broker.replication.divergence import DivergenceCheck, Verdict, judge

A, B = "a" * 64, "b" * 64


def test_a_replica_a_majority_disagrees_with_is_divergent() -> None:
    v = judge({10: A, 20: B}, {"n2": {10: A, 20: A}, "n3": {20: A}}, 3)
    assert v == Verdict(20, None, {"n2": 20, "n3": 20})


def test_agreeing_with_a_majority_is_fine_even_if_one_peer_differs() -> None:
    v = judge({10: A}, {"n2": {10: A}, "n3": {10: B}}, 3)
    assert v.divergent_at is None and v.undecided_at is None and v.followers_off == {"n3": 10}


def test_one_against_one_is_undecided() -> None:
    assert judge({10: A}, {"n2": {10: B}}, 3) == Verdict(None, 10, {"n2": 10})


def test_no_common_index_says_nothing() -> None:
    assert judge({10: A}, {"n2": {20: B}, "n3": {}}, 3) == Verdict()


def test_five_replicas_need_three_others_to_agree() -> None:
    peers = {"n2": {5: B}, "n3": {5: B}, "n4": {5: A}, "n5": {5: "c" * 64}}
    assert judge({5: A}, peers, 5).undecided_at == 5
    peers["n5"] = {5: B}
    assert judge({5: A}, peers, 5).divergent_at == 5


def test_the_check_marks_this_replica_once_and_a_leader_names_followers(
        caplog: pytest.LogCaptureFixture) -> None:
    marked: list[str] = []
    digests = {"10.0.0.2:1": {7: B}, "10.0.0.3:1": {7: B}}

    async def fetch(address: str):  # type: ignore[no-untyped-def]
        if address == "10.0.0.3:1":
            raise OSError("down")  # an unreachable peer does not count
        return digests[address]

    check = DivergenceCheck("n1", {"n1": "me", "n2": "10.0.0.2:1", "n3": "10.0.0.3:1"}, 3,
                            lambda: {7: A}, fetch, lambda: True, marked.append)
    with caplog.at_level(logging.ERROR, logger="broker.divergence"):
        v = asyncio.run(check.check_once())
    assert v.undecided_at == 7 and not marked  # one peer answered: it is one against one
    assert "n2" in caplog.text and "differs from this leader" in caplog.text

    async def both(address: str):  # type: ignore[no-untyped-def]
        return digests[address]

    check.fetch = both
    asyncio.run(check.check_once())
    asyncio.run(check.check_once())
    assert len(marked) == 1 and "index 7" in marked[0] and check.divergent == marked[0]


def test_the_verdict_survives_a_restart(tmp_path: Path) -> None:
    """Found by the soak: a divergent replica restarted served again until the next check."""
    marker = tmp_path / "DIVERGENT"

    async def fetch(address: str):  # type: ignore[no-untyped-def]
        return {7: B}

    peers = {"n1": "me", "n2": "10.0.0.2:1", "n3": "10.0.0.3:1"}
    first: list[str] = []
    check = DivergenceCheck("n1", peers, 3, lambda: {7: A}, fetch, lambda: False, first.append, marker=marker)
    assert check.divergent is None and not marker.exists()
    asyncio.run(check.check_once())
    assert first and marker.read_text() == first[0]
    again: list[str] = []  # the restarted replica: refused at once, before any check ran
    restarted = DivergenceCheck("n1", peers, 3, lambda: {}, fetch, lambda: False, again.append, marker=marker)
    assert restarted.divergent == first[0] and again == first
