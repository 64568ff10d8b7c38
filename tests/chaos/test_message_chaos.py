"""No acknowledged message lost, order kept, through any single failure -- with real network faults.

Each test runs one scenario on a fresh group of three broker processes whose every peer
link and every client link goes through Toxiproxy (``tests/chaos/brokers.py``), under an
ordered, idempotent workload (8 shard keys, one orderly push consumer, an offsets
monitor; ``tests/chaos/workload.py``). ``Scenario.finish`` heals, converges, reads every
replica, drains the consumer, kills the nodes, compares their CommitLogs and runs the
verifier (``tests/support/message_history.py``): no loss; per shard key the consumed
order equals the acknowledged order with no gaps; no duplicates; an unknown outcome at
most once; identical CommitLogs; committed offsets never going back; nothing delivered
that the final log does not hold at that place. Figures go to the chaos report.

Every scenario prints its seed (``CHAOS_SEED=N`` replays its choices) and is bounded:
each wait has a deadline, a leader fault must be followed by an acknowledged send within
30 s (the 3 s target is reported, not asserted), and ``pytest.mark.timeout`` caps the test.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.chaos import confirm
from tests.chaos.confirm import FaultNotApplied
from tests.chaos.nemesis import Nemesis
from tests.chaos.scenario import Scenario

pytestmark = [pytest.mark.chaos, pytest.mark.cluster, pytest.mark.timeout(150)]

MakeScenario = Callable[..., Scenario]

#: How long a node asked to stop (SIGTERM) may take before it is SIGKILLed.
GRACE_S = 10.0


def _others(s: Scenario, *names: str) -> list[str]:
    return [n for n in s.brokers.names if n not in names]


@pytest.mark.parametrize("secured", [False, True], ids=["open", "tls_acl"])
def test_leader_kill9_and_restart(make_scenario: MakeScenario, secured: bool) -> None:
    """kill -9 of the leader during ordered sends; it restarts and catches up. ``secured``
    (issue 15): TLS on the client ports (wss:// through the proxies: clients reconnecting
    to the new leader make new handshakes under load) and users and ACLs on (the producer
    and consumer a plain user with only its rights, authenticating on every new
    connection; the offsets monitor and the verifier's reads authenticated)."""
    s = make_scenario(tls=secured, acl=secured).start()
    old = s.leader_fault(s.brokers.kill, "kill -9 leader {leader}")
    s.event(f"new leader {s.leader(among=_others(s, old))}")
    s.workload.wait_more_acked(300, 30)
    s.restart(old)
    s.workload.wait_more_acked(200, 30)
    s.finish()


def test_leader_isolated_then_healed(make_scenario: MakeScenario) -> None:
    """The leader's peer and client links swallow bytes both ways (timeout toxic), then heal."""
    s = make_scenario().start()
    old = s.leader_fault(s.brokers.isolate, "isolated leader {leader} (peers and clients, both ways)")
    s.event(f"new leader {s.leader(among=_others(s, old))}")
    confirm.stepped_down(s, old)
    s.workload.wait_more_acked(300, 30)
    s.heal_and_finish(old)


def test_leader_cut_from_peers_while_clients_reach_it(make_scenario: MakeScenario) -> None:
    """The leader loses its peers but clients still reach it: it must not acknowledge what
    it cannot commit (the case the broken build of the self-test gets wrong)."""
    s = make_scenario().start()
    old = s.leader_fault(lambda leader: s.brokers.isolate(leader, clients=False),
                         "cut leader {leader} from its peers (clients still reach it)")
    confirm.stepped_down(s, old)
    s.workload.wait_more_acked(300, 30)
    s.heal_and_finish(old)


def test_follower_isolated_then_healed(make_scenario: MakeScenario) -> None:
    """A follower partitioned away (peers and clients); the majority goes on; it catches up."""
    s = make_scenario().start()
    leader = s.leader()
    follower = s.rng.choice(_others(s, leader))
    s.brokers.isolate(follower)
    s.event(f"isolated follower {follower}")
    confirm.match_frozen(s, leader, follower, own_log_frozen=True)
    s.workload.wait_more_acked(600, 30)
    s.heal_and_finish(follower)


def test_follower_cut_from_peers_while_clients_reach_it(make_scenario: MakeScenario) -> None:
    """A follower loses its peers but consumers reading from followers still reach it: it
    must serve only what it committed (stale, never uncommitted)."""
    follower_cut_from_peers(make_scenario(read_from="follower").start())


def follower_cut_from_peers(s: Scenario) -> None:
    """The follower-cut scenario on a started ``s`` (also run by the harness self-test)."""
    leader = s.leader()
    follower = s.rng.choice(_others(s, leader))
    s.brokers.isolate(follower, clients=False)
    s.event(f"cut follower {follower} from its peers (clients still reach it)")
    confirm.match_frozen(s, leader, follower, own_log_frozen=True)
    confirm.read_served(s, leader, follower, s.brokers.client_links[follower])  # by it, through its link
    s.workload.wait_more_acked(600, 30)
    s.heal_and_finish(follower)


@pytest.mark.parametrize("direction", ["leader_to_follower", "follower_to_leader"])
def test_one_way_partition(make_scenario: MakeScenario, direction: str) -> None:
    """Bytes in one direction only between the leader and a follower are swallowed."""
    one_way_partition(make_scenario().start(), direction)


def one_way_partition(s: Scenario, direction: str) -> None:
    """The one-way scenario on a started ``s`` (also run by the harness self-test)."""
    leader = s.leader()
    follower = s.rng.choice(_others(s, leader))
    src, dst = (leader, follower) if direction == "leader_to_follower" else (follower, leader)
    s.brokers.cut_one_way(src, dst)
    s.event(f"one-way cut {src} -> {dst}")
    # nothing of the leader's reaches the follower, or none of its answers the leader
    confirm.match_frozen(s, leader, follower, own_log_frozen=direction == "leader_to_follower")
    s.workload.wait_more_acked(500, 30)
    s.event(f"leader now {s.leader()}")
    s.heal_and_finish(follower)


def test_latency_on_every_link(make_scenario: MakeScenario) -> None:
    """100 +/- 80 ms on every peer and client link, both directions."""
    s = make_scenario(read_from="any").start()
    s.brokers.latency_everywhere(100, 80)
    s.event("latency 100+/-80 ms on every link")
    confirm.delay_seen(s, s.brokers.client_links[s.leader()], 0.04)  # >= 20 ms each way
    s.workload.wait_more_acked(150, 40)
    s.heal_and_finish()


@pytest.mark.parametrize("secured", [False, True], ids=["open", "tls_acl"])
def test_reset_peer_storms_on_client_links(make_scenario: MakeScenario, secured: bool) -> None:
    """Bursts of TCP resets on client links: requests dropped (upstream) or answers lost
    (downstream, outcome unknown); idempotent resends must not duplicate anything. A short
    send timeout leaves some outcomes unknown: each such message is stored at most once.
    ``secured``: TLS and ACLs on -- resets cut TLS handshakes, records and SCRAM exchanges
    midway."""
    s = make_scenario(send_timeout=1.5, tls=secured, acl=secured).start()
    links = s.brokers.client_links
    leader = s.leader()
    for burst in range(6):
        if burst == 0:  # every answer of the leader lost after its request got there
            chosen, stream, toxicity, timeout_ms = [leader], "downstream", 1.0, 0
        else:
            chosen = s.rng.sample(sorted(links), k=s.rng.randint(1, 3))
            stream = s.rng.choice(["upstream", "downstream", "both"])
            toxicity = s.rng.choice([0.5, 0.8, 1.0])
            timeout_ms = s.rng.choice([0, 50, 300])
        names = {n: links[n].reset_peer(toxicity, timeout_ms=timeout_ms, stream=stream) for n in chosen}
        s.event(f"burst {burst}: reset_peer {stream} toxicity {toxicity} after {timeout_ms} ms on {chosen}")
        hold_until = time.monotonic() + s.rng.uniform(2.0, 3.0)
        confirm.reset_seen(s, links[chosen[0]])
        time.sleep(max(0.0, hold_until - time.monotonic()))  # the fault's duration, not a synchronisation
        for n, toxics in names.items():
            links[n].remove_toxics(toxics)
        s.workload.wait_more_acked(50, 30)
    s.event("storms over")
    s.workload.wait_more_acked(200, 30)
    s.finish()


def test_rolling_restart(make_scenario: MakeScenario) -> None:
    """Every node asked to stop (SIGTERM; SIGKILL if it has not exited after 10 s) and
    started again in turn, under load. Failover is counted from the SIGTERM."""
    s = make_scenario().start()
    order = list(s.brokers.names)
    s.rng.shuffle(order)
    for name in order:
        was_leader = s.leader() == name
        s.brokers.sigterm(name)
        stopped_at = s.event(f"SIGTERM {name}{' (leader)' if was_leader else ''}")
        took = s.brokers.wait_exit(name, GRACE_S)
        s.event(f"{name} exited after {took:.2f}s" if took is not None
                else f"{name} still running {GRACE_S:g}s after SIGTERM: SIGKILLed")
        if took is None:
            s.notes.append(f"{name}{' (leader)' if was_leader else ''} ignored SIGTERM for {GRACE_S:g}s")
        if was_leader:
            s.failover_after(stopped_at)
        s.workload.wait_more_acked(100, 30)
        s.restart(name)
        s.workload.wait_more_acked(100, 30)
    if not s.failovers:
        raise FaultNotApplied("fault not applied: no node was leader when it was asked to stop")
    s.confirmed.append(f"{len(s.failovers)} leader(s) SIGTERMed")
    s.finish()


def test_all_nodes_killed_at_once(make_scenario: MakeScenario) -> None:
    """kill -9 of all three nodes at once, then all restarted: nothing acknowledged is lost."""
    s = make_scenario().start(warm_up=400)
    s.brokers.kill_all()
    killed_at = s.event("kill -9 of every node")
    s.brokers.start()
    s.event("all restarted")
    s.failover_after(killed_at)
    for name in s.brokers.names:
        s.catch_up(name, since=killed_at)
    s.workload.wait_more_acked(300, 30)
    s.finish()


def test_link_flapping_every_2s(make_scenario: MakeScenario) -> None:
    """The link between the leader and a follower goes down and up every 2 s. With pre-vote
    no election is expected (the follower still hears of the leader through the other
    follower); each down phase must hold the follower's match index on the leader."""
    s = make_scenario().start()
    leader = s.leader()
    follower = s.rng.choice(_others(s, leader))
    link = s.brokers.peer_links[frozenset((leader, follower))].link
    for cycle in range(4):
        link.cut("both")
        down_until = s.event(f"cycle {cycle}: link {leader}<->{follower} down") + 2.0
        if cycle == 0:
            confirm.match_frozen(s, leader, follower, own_log_frozen=True, timeout=1.9)
        time.sleep(max(0.0, down_until - time.monotonic()))  # the flap period: the fault itself
        link.heal()
        s.event(f"cycle {cycle}: link up; leader {s.leader()}")
        time.sleep(2.0)
    terms = sorted(s.workload.terms)  # every term the monitor saw, up to the last flap
    s.confirmed.append(f"terms seen while flapping: {terms}")
    s.workload.wait_more_acked(200, 30)
    s.finish()
    assert len(terms) == 1, f"the flapping link caused elections (pre-vote should prevent them): {terms}"


def test_randomized_nemesis(make_scenario: MakeScenario, chaos_duration: float) -> None:
    """Random single faults (kill -9, isolation, one-way cuts, latency, resets, flaps, a
    follower's disk lost -- alone or with the leader crashing after it) for
    ``--chaos-duration`` seconds (20 in CI), the first of them a disk loss."""
    s = make_scenario(read_from="any", send_timeout=5.0).start()
    first = s.rng.choice(["lose_follower_disk", "lose_follower_disk_then_kill_leader"])
    Nemesis(s).run(chaos_duration, first=(first,))
    s.workload.wait_more_acked(200, 30)
    s.finish(exactly_once=False)  # consumer restarts may redeliver what was not committed yet
