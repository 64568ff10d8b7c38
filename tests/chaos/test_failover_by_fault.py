"""Failover time by fault type (issue 35): each leader fault injected in turn, many times.

One scenario on a fresh group (the chaos harness: every link through Toxiproxy, the
ordered idempotent workload, the verifier at the end). Rounds go through ``FAULTS`` in
order -- kill -9 of the leader, the leader isolated (peers and clients), the leader cut
from its peers while clients still reach it, a one-way cut between the leader and a
follower, and one-way cuts between the leader and every peer (its bytes out swallowed:
``leader_unheard``; its peers' bytes in: ``leader_deaf``) -- ``FAILOVER_ROUNDS`` times
(env, default 2; the figures in docs/CHAOS.md come from 10). Each round injects the
fault, measures the time to the first acknowledged send started after it
(``Scenario.failover_after``, filed by fault type), heals, restarts what is down, waits
until the nodes cut off caught up and sends are acknowledged again.

The report's "failover s by fault" column gives max and median per type; no time is
asserted (speed is a measurement). Asserted: the verifier's invariants (nothing lost,
nothing duplicated, order per key) and no more term rises than faults injected -- an
election the faults did not cause is a flapping leader.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from tests.chaos.nemesis import Nemesis
from tests.chaos.scenario import Scenario

ROUNDS = int(os.environ.get("FAILOVER_ROUNDS", "2"))
FAULTS = ("kill_leader", "isolate_leader", "leader_cut_from_peers", "one_way_cut_at_leader",
          "leader_unheard", "leader_deaf")
#: one round: the fault, its failover, healing, a restart and catch-up, 20 sends acknowledged
ROUND_LIMIT_S = 40

pytestmark = [pytest.mark.chaos, pytest.mark.cluster,
              pytest.mark.timeout(150 + ROUNDS * len(FAULTS) * ROUND_LIMIT_S)]


def test_failover_by_fault_type(make_scenario: Callable[..., Scenario]) -> None:
    s = make_scenario(send_timeout=10.0).start()
    nemesis = Nemesis(s)
    injected = 0
    for round_no in range(ROUNDS):
        for fault in FAULTS:
            s.event(f"round {round_no + 1}/{ROUNDS}: {fault}")
            cut_off = nemesis.faults[fault]()
            injected += 1
            nemesis.recover(cut_off)
    s.notes.append(f"{injected} faults: {ROUNDS} rounds of {', '.join(FAULTS)}")
    s.confirmed.append(f"{injected} faults, failovers by type {sorted(s.failovers_by_fault)}")
    terms = s.workload.terms
    rises = max(terms) - min(terms) if terms else 0
    s.workload.wait_more_acked(200, 30)
    s.finish()
    assert rises <= injected, f"{rises} term rises for {injected} faults: elections the faults did not cause"
