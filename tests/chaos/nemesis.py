"""The randomized nemesis: one single fault at a time, chosen and timed by the scenario's seed.

Each round picks a fault, holds it for 1.5-4 s (a leader fault is held at least until a
send is acknowledged again, which measures the failover), sometimes restarts the
consumer while the fault still holds (it resumes from the committed offsets: a stale
offset read would show as an offset going back), then heals every link,
restarts a killed node, measures its catch-up, and waits until sends are acknowledged
again before the next round: never more than one failure at a time, which is the claim
under test. Choices come from ``Scenario.rng``; wall-clock timing does not, so a replay
with the same seed makes the same choices with slightly different interleavings.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from client.errors import ClientError
from tests.chaos import confirm
from tests.chaos.scenario import Scenario

__all__ = ["Nemesis"]

RESTART_JOIN_S = 90.0  # a consumer restart begun during a fault ends this long after healing


class Nemesis:
    def __init__(self, scenario: Scenario) -> None:
        self.s = scenario
        self.rng = scenario.rng
        self.faults: dict[str, Callable[[], list[str]]] = {
            "kill_leader": self.kill_leader, "kill_follower": self.kill_follower,
            "isolate_leader": self.isolate_leader, "isolate_follower": self.isolate_follower,
            "leader_cut_from_peers": self.leader_cut_from_peers, "one_way_cut": self.one_way_cut,
            "one_way_cut_at_leader": self.one_way_cut_at_leader,
            "leader_unheard": self.leader_unheard, "leader_deaf": self.leader_deaf,
            "latency": self.latency, "client_resets": self.client_resets, "flap": self.flap,
            "lose_follower_disk": self.lose_follower_disk,
            "pause_leader": self.pause_leader, "pause_follower": self.pause_follower,
            "lose_follower_disk_then_kill_leader": self.lose_follower_disk_then_kill_leader,
        }
        self._forgetful: set[str] = set()  # replicas that lost their disk this round

    #: the faults that hit the leader: every run injects one at least
    LEADER_FAULTS = ("kill_leader", "isolate_leader", "leader_cut_from_peers", "leader_unheard",
                     "leader_deaf", "lose_follower_disk_then_kill_leader", "pause_leader")

    def run(self, duration: float, first: tuple[str, ...] = ()) -> list[str]:
        """Inject faults for ``duration`` seconds -- ``first`` in order, then random ones;
        returns their names in order."""
        done: list[str] = []
        end = time.monotonic() + duration
        queued = list(first)
        while queued or time.monotonic() < end or not any(d.split("+")[0] in self.LEADER_FAULTS
                                                          for d in done):
            if not queued and time.monotonic() >= end:
                queued.append(self.rng.choice(self.LEADER_FAULTS))  # no leader fault yet: one now
            name = queued.pop(0) if queued else self.rng.choice(sorted(self.faults))
            hold_until = time.monotonic() + self.rng.uniform(1.5, 4.0)
            healed_later = self.faults[name]()
            restart: threading.Thread | None = None
            unstarted: list[ClientError] = []
            if self.rng.random() < 0.25:  # a consumer restart while the fault holds
                restart = threading.Thread(target=self._restart_consumer, args=(hold_until, unstarted),
                                           name="nemesis-consumer-restart", daemon=True)
                restart.start()
                name += "+consumer_restart"
            # the fault's duration: healed then, even while the consumer restart still runs
            # (its shutdown commits offsets to brokers it cannot reach and waits out their
            # deadlines; held for it, a fault that stops every acknowledgement stalled sends
            # for 15 s in the hour-long soak)
            time.sleep(max(0.0, hold_until - time.monotonic()))
            done.append(name)
            self.recover(healed_later)
            if restart is not None:
                restart.join(RESTART_JOIN_S)
                if restart.is_alive():
                    raise TimeoutError(f"the consumer restart did not end within {RESTART_JOIN_S} s "
                                       "of healing")
            if unstarted:
                self.s.workload.restart_consumer()
                self.s.event("nemesis: consumer started after healing")
        self.s.notes.append("nemesis: " + ", ".join(done))
        self.s.confirmed.append(f"leader faults: {sum(d.split('+')[0] in self.LEADER_FAULTS for d in done)}"
                                f" of {len(done)}, each fault confirmed")
        return done

    def _restart_consumer(self, hold_until: float, unstarted: list[ClientError]) -> None:
        began = time.monotonic()
        try:
            self.s.workload.restart_consumer(start_timeout=max(2.0, hold_until - began))
            self.s.event(f"nemesis: consumer restarted during the fault in {time.monotonic() - began:.1f}s")
        except ClientError as e:  # every client link is cut: it starts after healing
            unstarted.append(e)
            self.s.event(f"nemesis: the consumer could not start during the fault ({e})")

    def recover(self, cut_off: list[str]) -> None:
        """Heal every link, restart what is down, measure the catch-up of the nodes that
        were cut off or down, and wait until sends are acknowledged again."""
        b = self.s.brokers
        b.heal()
        healed_at = time.monotonic()
        down = b.down()
        if down:
            b.start(down)
        self.s.event(f"nemesis: healed{f', restarted {down}' if down else ''}")
        for name in sorted(set(cut_off) | set(down)):
            self.s.catch_up(name, since=healed_at)
        for name in sorted(self._forgetful):  # at most one forgetful replica at a time
            b.wait_status(name, lambda st: st["voter"] is True, 30, f"{name}'s new storage recorded")
            self.s.event(f"nemesis: {name}'s new storage recorded: it votes again")
        self._forgetful.clear()
        self.s.workload.wait_more_acked(20, 30, "sends acknowledged again after healing")

    # -- faults: each injects one and returns the nodes to watch catch up after healing -----
    def _leader(self) -> str:
        return self.s.leader()

    def _follower(self, leader: str) -> str:
        return self.rng.choice([n for n in self.s.brokers.names if n != leader])

    def kill_leader(self) -> list[str]:
        self.s.leader_fault(self.s.brokers.kill, "nemesis: kill -9 leader {leader}", "kill_leader")
        return []

    def kill_follower(self) -> list[str]:
        follower = self._follower(self._leader())
        self.s.brokers.kill(follower)
        self.s.event(f"nemesis: kill -9 follower {follower}")
        return []

    def isolate_leader(self) -> list[str]:
        old = self.s.leader_fault(self.s.brokers.isolate, "nemesis: isolate leader {leader}",
                                  "isolate_leader")
        confirm.stepped_down(self.s, old)
        return [old]

    def leader_cut_from_peers(self) -> list[str]:
        old = self.s.leader_fault(lambda leader: self.s.brokers.isolate(leader, clients=False),
                                  "nemesis: cut leader {leader} from its peers", "leader_cut_from_peers")
        confirm.stepped_down(self.s, old)
        return [old]

    def leader_unheard(self) -> list[str]:
        """Bytes from the leader to every peer swallowed (theirs to it still flow): the
        others elect a leader, whose messages reach and depose the old one."""
        def cut(leader: str) -> None:
            for peer in self.s.brokers.names:
                if peer != leader:
                    self.s.brokers.cut_one_way(leader, peer)
        old = self.s.leader_fault(cut, "nemesis: one-way cut {leader} -> every peer", "leader_unheard")
        confirm.stepped_down(self.s, old)
        return [old]

    def leader_deaf(self) -> list[str]:
        """Bytes from every peer to the leader swallowed (its own still flow): its peers
        hear it, it hears no answer, and it steps down when its lease runs out."""
        def cut(leader: str) -> None:
            for peer in self.s.brokers.names:
                if peer != leader:
                    self.s.brokers.cut_one_way(peer, leader)
        old = self.s.leader_fault(cut, "nemesis: one-way cut every peer -> {leader}", "leader_deaf")
        confirm.stepped_down(self.s, old)
        return [old]

    def pause_leader(self) -> list[str]:
        """The leader SIGSTOPped (a frozen host: its sockets open, nothing answered): the
        others elect; resumed at healing, it hears the new term and follows."""
        old = self.s.leader_fault(self.s.brokers.pause, "nemesis: SIGSTOP leader {leader}", "leader_sigstop")
        return [old]

    def pause_follower(self) -> list[str]:
        """A follower SIGSTOPped: the consumer's pulls held there move to another replica
        (issue 35); the time until every queue delivers again is filed as
        ``pull_follower_sigstop``."""
        follower = self._follower(self._leader())
        self.s.brokers.pause(follower)
        at = self.s.event(f"nemesis: SIGSTOP follower {follower}")
        gap = self.s.workload.delivery_gap_after(at, 30)
        self.s.failovers_by_fault.setdefault("pull_follower_sigstop", []).append(round(gap, 3))
        self.s.event(f"every queue delivering again {gap:.2f}s after the SIGSTOP")
        return [follower]

    def isolate_follower(self) -> list[str]:
        leader = self._leader()
        follower = self._follower(leader)
        self.s.brokers.isolate(follower, clients=self.rng.random() < 0.5)
        self.s.event(f"nemesis: isolate follower {follower}")
        confirm.cut_acted(self.s, leader, follower, own_log_frozen=True)
        return [follower]

    def _confirm_one_way(self, src: str, dst: str, leader: str) -> None:
        """A one-way cut acts: between the leader and a follower the follower's match index
        freezes (and its own log, when the leader's bytes are the ones swallowed); between
        two followers, which exchange nothing until an election, the toxic is on their link."""
        if leader in (src, dst):
            follower = dst if src == leader else src
            confirm.cut_acted(self.s, leader, follower, own_log_frozen=src == leader)
        else:
            pl = self.s.brokers.peer_links[frozenset((src, dst))]
            confirm.toxic_on(self.s, pl.link, "timeout", pl.stream_from(src))

    def one_way_cut(self) -> list[str]:
        """Bytes one way between two replicas swallowed; when one of them leads, the time to
        the next acknowledged send is filed as ``one_way_cut`` (the leader usually keeps
        leading: its majority is intact -- the confirmation says whether it did)."""
        src, dst = self.rng.sample(self.s.brokers.names, 2)
        leader = self._leader()
        self.s.brokers.cut_one_way(src, dst)
        at = self.s.event(f"nemesis: one-way cut {src} -> {dst}")
        if leader in (src, dst):
            self.s.failover_after(at, "one_way_cut")
        self._confirm_one_way(src, dst, leader)
        return [src, dst]

    def one_way_cut_at_leader(self) -> list[str]:
        """Bytes one way between the leader and a follower swallowed, the direction drawn;
        the time to the next acknowledged send is filed as ``one_way_cut``."""
        leader = self._leader()
        follower = self._follower(leader)
        src, dst = (leader, follower) if self.rng.random() < 0.5 else (follower, leader)
        self.s.brokers.cut_one_way(src, dst)
        self.s.failover_after(self.s.event(f"nemesis: one-way cut {src} -> {dst} (leader {leader})"),
                              "one_way_cut")
        self._confirm_one_way(src, dst, leader)
        return [src, dst]

    def latency(self) -> list[str]:
        ms = self.rng.choice([20, 50, 100, 150])
        jitter = int(ms * 0.8)
        self.s.brokers.latency_everywhere(ms, jitter)
        self.s.event(f"nemesis: latency {ms}+/-{jitter} ms on every link")
        # a request and its answer each cross the toxic once, each delayed >= ms - jitter
        confirm.delay_seen(self.s, self.s.brokers.client_links[self._leader()], 2 * (ms - jitter) / 1000)
        return []

    def client_resets(self) -> list[str]:
        links = self.s.brokers.client_links
        chosen = self.rng.sample(sorted(links), k=self.rng.randint(1, 3))
        stream = self.rng.choice(["upstream", "downstream", "both"])
        for name in chosen:
            links[name].reset_peer(self.rng.choice([0.5, 1.0]), timeout_ms=self.rng.choice([0, 100]),
                                   stream=stream)
        self.s.event(f"nemesis: reset_peer {stream} on client links of {chosen}")
        confirm.reset_seen(self.s, links[chosen[0]])
        return []

    def _lose_disk(self, name: str) -> None:
        """kill -9 ``name``, then its data directory wiped (a replaced host) or its Raft hard
        state deleted: it comes back as a new storage (issue 24)."""
        self.s.brokers.kill(name)
        how = self.rng.choice(["wiped", "hard state deleted"])
        if how == "wiped":
            self.s.brokers.wipe(name)
        else:
            (self.s.brokers.base / name / "raft-state").unlink()
        self._forgetful.add(name)
        self.s.event(f"nemesis: kill -9 follower {name}, its disk lost ({how})")

    def lose_follower_disk(self) -> list[str]:
        self._lose_disk(self._follower(self._leader()))
        return []

    def lose_follower_disk_then_kill_leader(self) -> list[str]:
        """The sequence of issue 24: a follower's disk lost, then the leader crashes; the
        two left (one of them forgetful) must not elect a leader -- the history verifier
        would see the acknowledged messages lost -- until the old leader is back."""
        leader = self._leader()
        self._lose_disk(self._follower(leader))
        self.s.brokers.kill(leader)
        self.s.event(f"nemesis: kill -9 leader {leader}")
        return []

    def flap(self) -> list[str]:
        """A peer link down 1 s, up 1 s, 3 times. The first down phase is confirmed (between
        the leader and a follower: the follower's match index frozen, which may hold that
        phase longer than 1 s; between two followers: the toxic on their link)."""
        a, b = self.rng.sample(self.s.brokers.names, 2)
        leader = self._leader()
        link = self.s.brokers.peer_links[frozenset((a, b))].link
        self.s.event(f"nemesis: flap {a}<->{b} every 1 s, 3 times")
        for cycle in range(3):
            link.cut("both")
            up_at = time.monotonic() + 1.0
            if cycle == 0:
                if leader in (a, b):
                    follower = b if a == leader else a
                    confirm.cut_acted(self.s, leader, follower, own_log_frozen=True, timeout=10)
                else:
                    confirm.toxic_on(self.s, link, "timeout", "upstream")
            time.sleep(max(0.0, up_at - time.monotonic()))  # the flap period: the fault itself
            link.heal()
            time.sleep(1.0)
        return [a, b]
