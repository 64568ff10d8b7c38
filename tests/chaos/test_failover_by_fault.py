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

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.chaos.nemesis import Nemesis
from tests.chaos.scenario import Scenario

ROUNDS = int(os.environ.get("FAILOVER_ROUNDS", "2"))
#: [raft] settings over the defaults, to measure others: FAILOVER_RAFT='{"leader_lease_ms": 300}'
RAFT_SETTINGS = json.loads(os.environ.get("FAILOVER_RAFT", "{}"))
#: the fault kinds, in order (FAILOVER_FAULTS=kill_leader,leader_deaf picks some)
FAULTS = tuple(os.environ.get("FAILOVER_FAULTS", "").split(",")) if os.environ.get("FAILOVER_FAULTS") else (
    "kill_leader", "isolate_leader", "leader_cut_from_peers", "one_way_cut_at_leader", "leader_unheard",
    "leader_deaf")
#: one round: the fault, its failover, healing, a restart and catch-up, 20 sends acknowledged
ROUND_LIMIT_S = 40

pytestmark = [pytest.mark.chaos, pytest.mark.cluster,
              pytest.mark.timeout(150 + ROUNDS * len(FAULTS) * ROUND_LIMIT_S)]


def test_failover_by_fault_type(make_scenario: Callable[..., Scenario]) -> None:
    s = make_scenario(send_timeout=10.0, raft_settings=RAFT_SETTINGS).start()
    if RAFT_SETTINGS:
        s.notes.append(f"[raft] settings: {RAFT_SETTINGS}")
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


#: CPU burners beside the group in the calm test: with the load of the other work on the
#: box, more runnable processes than cores (what the CI suite does to the brokers)
BURNERS = 2
CALM_ACKS = 6000


def test_no_elections_without_faults_under_cpu_load(make_scenario: Callable[..., Scenario]) -> None:
    """The short election timeouts and lease must not depose a healthy leader on a busy
    machine: ``CALM_ACKS`` sends acknowledged beside ``BURNERS`` busy processes, no fault,
    and the term does not move (a term rise here is a flapping election)."""
    s = make_scenario(raft_settings=RAFT_SETTINGS).start()
    terms_before = set(s.workload.terms)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(BURNERS)]
    try:
        s.event(f"{BURNERS} CPU burners started (pids {[p.pid for p in burners]})")
        s.workload.wait_more_acked(CALM_ACKS, 180, f"{CALM_ACKS} sends acknowledged under CPU load")
    finally:
        for p in burners:
            p.kill()
            p.wait(10)
    s.event("CPU burners stopped")
    terms = s.workload.terms
    s.confirmed.append(f"terms seen {sorted(terms)} (before the load: {sorted(terms_before)})")
    s.workload.wait_more_acked(100, 30)
    s.finish()
    assert max(terms) == min(terms), f"the term rose without a fault under load: {sorted(terms)}"
