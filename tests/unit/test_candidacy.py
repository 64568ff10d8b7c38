"""``dledger.raft.election.candidacy``: what a replica that must not lead does with a leadership transfer."""

from __future__ import annotations

import logging

import pytest

from dledger.raft.election.candidacy import Candidacy


def test_refused_transfers_are_logged_every_ten_seconds_however_often_they_come(
        caplog: pytest.LogCaptureFixture) -> None:
    """A full replica refuses every TimeoutNow; a leader retrying every few seconds must not
    silence the log for good: the refusal is logged again once 10 s passed since it last was."""
    now = [0.0]
    candidacy = Candidacy((1000, 2000), {"its disk is full"}, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="dledger.replicated_log"):
        for at in (0.0, 4.0, 8.0, 12.0, 16.0, 20.0, 22.5):
            now[0] = at
            assert candidacy.refuse_transfer({"type": "timeout_now"})
    logged = [r for r in caplog.records if "refused a leadership transfer" in r.getMessage()]
    assert len(logged) == 3  # at 0, 12 and 22.5
    assert not candidacy.refuse_transfer({"type": "append_entries"})
