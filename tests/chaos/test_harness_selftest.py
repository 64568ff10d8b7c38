"""The harness can fail: scenarios on deliberately broken builds and helpers must not "hold".

Each test runs a real scenario with one thing broken that the verdict must name:

* ``test_a_broker_that_crashes_on_its_own_fails_the_scenario``: the nodes run
  ``tests/support/crashing_broker.py``; under the latency toxic a follower exits by itself.
  ``finish`` used to restart it like a node the test had killed and report "hold";
* ``test_a_one_way_cut_on_the_wrong_proxy_is_not_applied``: ``cut_one_way`` broken to cut
  another link; the one-way scenario used to hold with nothing cut where it said;
* ``test_reads_of_the_cut_follower_that_reach_another_node_are_not_its_reads``: the cut
  follower's client proxy broken to lead to another node; nothing showed a read was served
  by the cut follower (issue 31 G1), now ``confirm.read_served`` must say it was not.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.chaos.brokers import ChaosBrokers
from tests.chaos.confirm import FaultNotApplied
from tests.chaos.scenario import Scenario
from tests.chaos.test_message_chaos import follower_cut_from_peers, one_way_partition
from tests.support.crashing_broker import CRASH_STATUS, crash_file
from tests.support.message_history import Violation

pytestmark = [pytest.mark.chaos, pytest.mark.cluster, pytest.mark.timeout(150)]

MakeScenario = Callable[..., Scenario]
ROOT = str(Path(__file__).resolve().parents[2])  # the broker processes import tests.support


def _importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))


def test_a_broker_that_crashes_on_its_own_fails_the_scenario(make_scenario: MakeScenario,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _importable(monkeypatch)
    s = make_scenario(read_from="any", entry="tests.support.crashing_broker")
    s.expect_violation = True
    s.start()
    s.brokers.latency_everywhere(100, 80)
    s.event("latency 100+/-80 ms on every link")
    victim = s.rng.choice([n for n in s.brokers.names if n != s.leader()])
    crash_file(s.brokers.base / f"{victim}.toml").touch()
    s.event(f"BROKEN BUILD: {victim} told to crash on its own")
    s.workload.wait_more_acked(150, 40)
    with pytest.raises(Violation, match=f"{victim} \\(pid \\d+\\) died on its own with exit status "
                                        f"{CRASH_STATUS}") as caught:
        s.heal_and_finish()
    assert "TEST-ONLY CRASHING BUILD" in str(caught.value)  # the log tail is shown
    print(f"the harness caught the crash: {str(caught.value)[:600]}")


def test_a_one_way_cut_on_the_wrong_proxy_is_not_applied(make_scenario: MakeScenario,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken helper: ``cut_one_way`` cuts the link between the leader and the OTHER
    follower. The one-way scenario must fail as "fault not applied"."""
    def wrong_proxy(self: ChaosBrokers, src: str, dst: str) -> None:
        other = next(n for n in self.names if n not in (src, dst))
        leader = src if (self.status(src) or {}).get("role") == "leader" else dst
        pl = self.peer_links[frozenset((leader, other))]
        pl.link.cut(pl.stream_from(leader))

    monkeypatch.setattr(ChaosBrokers, "cut_one_way", wrong_proxy)
    s = make_scenario().start()
    s.expect_violation = True
    with pytest.raises(FaultNotApplied, match=r"fault not applied: .*match index for .* moved"):
        one_way_partition(s, "leader_to_follower")
    s.brokers.heal()


def test_reads_of_the_cut_follower_that_reach_another_node_are_not_its_reads(
        make_scenario: MakeScenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken helper: the follower cut from its peers gets the client proxy of another
    node, so the reads "through its link" are served by a replica that knows the leader.
    The follower-cut scenario must fail as "fault not applied"."""
    original = ChaosBrokers.isolate

    def misrouted(self: ChaosBrokers, name: str, clients: bool = True) -> None:
        original(self, name, clients)
        other = next(n for n in self.names if n != name)
        self.client_links = {**self.client_links, name: self.client_links[other]}

    monkeypatch.setattr(ChaosBrokers, "isolate", misrouted)
    s = make_scenario(read_from="follower").start()
    s.expect_violation = True
    with pytest.raises(FaultNotApplied, match=r"fault not applied: the pull through client-to-n\d was served "
                                              r"by a replica whose queue 0 ends at \d+, not by the cut"):
        follower_cut_from_peers(s)
    s.brokers.heal()
