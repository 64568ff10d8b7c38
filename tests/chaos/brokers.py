"""Three broker processes with every link through Toxiproxy, and the faults the scenarios inject.

Links (all on 127.0.0.1, listen ports from ``raftmq.local_group.free_port``)::

    peers:   pysyncobj dials each pair once, from the node with the larger address
             string: one proxy per dialed pair "<dialer>-to-<acceptor>", set as the
             dialer's ``group.dial`` (the acceptor keeps its identity)
    clients: one proxy per node "client-to-<node>"; clients are given the proxies as
             ``servers`` and ``address_map = {registered address: proxy}`` so that
             NOT_LEADER redirects and routes also go through them; with ``tls`` the
             brokers serve wss:// and https:// (a local CA; the proxies carry the TLS
             bytes, and the certificate names 127.0.0.1, so a proxied link verifies too)

``upstream`` on a peer proxy is the dialer -> acceptor direction, so a one-way cut
``src -> dst`` is ``upstream`` when ``src`` dials and ``downstream`` otherwise.
The test harness itself (status, offsets monitor, final reads) talks to the nodes
directly: it observes, it is not a client under test.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

from dledger.config import MAX_ENTRY_BYTES
from raftmq.cluster_http import ClusterHttp
from raftmq.local_acl import acl_broker_options, local_credentials
from raftmq.local_group import LocalGroup, free_port
from tests.chaos.node_health import NodeDeaths, unexpected_log_lines
from tests.chaos.toxi import Link, Stream, Toxi

__all__ = ["BROKER_GROUP", "RETENTION", "SEGMENT_BYTES", "ChaosBrokers", "PeerLink"]

BROKER_GROUP = "g1"
SEGMENT_BYTES = 4 << 20
#: Retention active during the faults: the smallest segments (~240 KiB), a size cap of
#: four of them, checked five times a second -- the log's start moves every few seconds.
RETENTION = {"segment_bytes": 4 * MAX_ENTRY_BYTES, "retention_bytes": 16 * MAX_ENTRY_BYTES,
             "retention_check_s": 0.2}
POLL_S = 0.05


def _state(pid: int) -> str:
    """The kernel's one-letter state of process ``pid`` (``T``: stopped by a signal)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


@dataclass(frozen=True, slots=True)
class PeerLink:
    dialer: str
    acceptor: str
    link: Link

    def stream_from(self, src: str) -> Stream:
        """The proxy stream carrying bytes sent by ``src``."""
        return "upstream" if src == self.dialer else "downstream"


class ChaosBrokers:
    """A 3-node broker group under ``base`` whose links all go through ``toxi``; ``spare``
    more nodes (n4, n5, ...) are laid out with their links, to be started as learners
    and added to the group (``start_learner``, ``retire``)."""

    def __init__(self, base: Path, toxi: Toxi, raft: dict[str, Any] | None = None,
                 spare: int = 0, entry: str = "broker", tls: bool = False, acl: bool = False) -> None:
        """``raft``: settings over the default (4 MiB segments, no retention), e.g. RETENTION;
        ``entry``: the module the nodes run (the self-test's broken build); ``tls``: TLS on
        the client ports (``client_tls`` is what clients are given); ``acl``: users and ACLs
        on, a super user in ``credentials`` (``raftmq.local_acl``)."""
        self.base = base
        self.toxi = toxi
        raft = {"segment_bytes": SEGMENT_BYTES, **(raft or {})}
        self.segment_bytes = int(raft["segment_bytes"])
        self.retention = "retention_bytes" in raft
        base.mkdir(parents=True, exist_ok=True)
        access = acl_broker_options(base) if acl else {}
        #: the super user's (None: no ACLs): the workload's admin, the monitor, the verifier's reads
        self.credentials = local_credentials(base)
        self.group = LocalGroup(base, 3, module="broker", group=BROKER_GROUP, raft=raft,
                                broker={"index_slots": 4096, "index_entries": 65536, **access}, entry=entry,
                                tls=tls)
        #: the clients' ``tls=`` (False: plain, whatever the environment says)
        self.client_tls = self.group.client_tls or False
        #: the harness's own HTTP reads (https with TLS; ``/admin/...`` as the super user with ACLs)
        self.http = ClusterHttp.with_tls(self.group.client_tls, self.credentials)
        self.nodes = self.group.nodes
        #: the processes that died without the test stopping them (``tests/chaos/node_health.py``)
        self.deaths = NodeDeaths(self.group)
        #: patterns of ERROR/CRITICAL log lines (and their tracebacks) this scenario expects
        self.expected_log: list[str] = []
        #: the current members: what converge, the verifier and the watchers look at
        self.names = list(self.nodes)
        initial = list(self.names)
        for i in range(spare):
            self.group.add_node(f"n{len(initial) + i + 1}", initial)
        self.incarnation = dict.fromkeys(self.nodes, 0)
        self.paused: set[str] = set()  # SIGSTOPped by ``pause``
        self.peer_links: dict[frozenset[str], PeerLink] = {}
        #: a learner dials every member whatever the addresses (it says "readonly"): for
        #: pairs with a spare node, the reverse direction has a proxy too
        self.learner_links: dict[tuple[str, str], Link] = {}
        self._dial: dict[str, dict[str, str]] = {n: {} for n in self.nodes}
        for a, b in combinations(self.nodes, 2):
            dialer, acceptor = (a, b) if self.nodes[a].raft > self.nodes[b].raft else (b, a)
            link = toxi.proxy(f"{dialer}-to-{acceptor}", free_port(), _port(self.nodes[acceptor].raft))
            self.peer_links[frozenset((a, b))] = PeerLink(dialer, acceptor, link)
            self._dial[dialer][acceptor] = link.listen
            if a not in initial or b not in initial:
                back = toxi.proxy(f"{acceptor}-to-{dialer}", free_port(), _port(self.nodes[dialer].raft))
                self.learner_links[(acceptor, dialer)] = back
                self._dial[acceptor][dialer] = back.listen
        for name in initial:
            self.group.write_config(name, self._dial[name], peers=initial)
        self.client_links = {n: toxi.proxy(f"client-to-{n}", free_port(), _port(self.nodes[n].http))
                             for n in self.nodes}
        self.address_map = {self.nodes[n].http: link.listen for n, link in self.client_links.items()}
        #: what clients are given: the first three nodes' proxies (they learn the rest)
        self.servers = [self.client_links[n].listen for n in initial]

    # -- membership ------------------------------------------------------------------
    def start_learner(self, name: str) -> None:
        """Start spare node ``name`` with ``join = true`` and the current members as peers;
        it catches up as a learner until ``raftmq replica add`` makes it a member."""
        self.group.write_config(name, self._dial[name], peers=[*self.names, name], join=True)
        self.incarnation[name] += 1
        self.group.start_node(name)

    def admit(self, name: str) -> None:
        """``name`` is a member now: converge and the verifier include it."""
        self.names = [*self.names, name]

    def retire(self, name: str) -> None:
        """``name`` was removed from the group: stop it (SIGTERM) and forget it."""
        self.names = [n for n in self.names if n != name]
        self.deaths.stopping(name)
        if self.alive(name):  # one dead on its own is recorded by ``deaths`` (the scenario fails)
            self.group.terminate(name)

    # -- processes -------------------------------------------------------------------
    def start(self, names: Iterable[str] | None = None) -> None:
        for name in names or self.names:
            self.deaths.check([name])  # one that died on its own is recorded, not restarted silently
            self.incarnation[name] += 1
            self.group.start_node(name)

    def kill(self, name: str) -> None:
        """SIGKILL (a crash: no clean-up, the page cache survives). One that died on its own
        is recorded by ``deaths`` (the scenario fails naming it), not raised here."""
        self.deaths.stopping(name)
        if self.alive(name):
            self.group.kill(name)

    def kill_all(self) -> None:
        """SIGKILL every live node (members or not) at once, then reap them."""
        for name in self.nodes:
            self.deaths.stopping(name)
        procs = [p.proc for p in self.nodes.values() if p.proc is not None and p.proc.poll() is None]
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
        for proc in procs:
            proc.wait(timeout=10)

    def terminate(self, name: str) -> None:
        self.deaths.stopping(name)
        if self.alive(name):
            self.group.terminate(name)

    def pause(self, name: str) -> None:
        """SIGSTOP ``name`` (a stalled process: its sockets stay open, nothing answers) and
        wait until the kernel reports it stopped; ``resume`` (or ``heal``) continues it."""
        proc = self.nodes[name].proc
        assert proc is not None and proc.poll() is None, f"{name} is not running"
        proc.send_signal(signal.SIGSTOP)
        self.paused.add(name)
        deadline = time.monotonic() + 5.0
        while _state(proc.pid) not in ("T", "t"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} (pid {proc.pid}) not stopped 5 s after SIGSTOP")
            time.sleep(0.01)

    def resume(self, name: str) -> None:
        """SIGCONT a node ``pause`` stopped."""
        proc = self.nodes[name].proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
        self.paused.discard(name)

    def sigterm(self, name: str) -> None:
        """Ask ``name`` to stop (graceful shutdown); returns at once."""
        proc = self.nodes[name].proc
        self.deaths.stopping(name)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    def wait_exit(self, name: str, timeout: float) -> float | None:
        """Seconds until ``name`` exited, or None if it had to be SIGKILLed after ``timeout``."""
        proc = self.nodes[name].proc
        if proc is None:
            return 0.0
        started = time.monotonic()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(name)
            return None
        return time.monotonic() - started

    def wipe(self, name: str) -> None:
        """The host's disk replaced: ``name`` (down) loses its whole data directory."""
        shutil.rmtree(self.base / name)

    def stop(self) -> None:
        """Every node stopped by PID (the fixture's clean-up, also on failure)."""
        self.group.stop()

    def log_problems(self) -> list[str]:
        """The ERROR/CRITICAL lines and tracebacks of every node's log that this scenario did
        not expect (``expected_log``), at most 5 per node."""
        problems = []
        for name in self.nodes:
            lines = unexpected_log_lines(self.base / f"{name}.log", self.expected_log)
            if lines:
                shown = "\n  ".join(lines[:5])
                problems.append(f"{name}'s log has {len(lines)} unexpected ERROR/CRITICAL lines or "
                                f"tracebacks:\n  {shown}")
        return problems

    def alive(self, name: str) -> bool:
        return self.nodes[name].alive

    def down(self) -> list[str]:
        return [n for n in self.names if not self.alive(n)]

    # -- observation (direct, not through the proxies) ------------------------------------
    def status(self, name: str) -> dict[str, Any] | None:
        return self.group.status(name, timeout=1.0) if self.alive(name) else None

    def leader(self, timeout: float = 30.0, among: list[str] | None = None) -> str:
        return self.group.wait_leader(timeout=timeout, among=among or self.names)

    def wait_status(self, name: str, predicate: Callable[[dict[str, Any]], bool], timeout: float,
                    what: str) -> dict[str, Any]:
        return self.group.wait_status(name, predicate, timeout, what)

    def highest_commit(self, names: Iterable[str]) -> int:
        """The highest commit index any of ``names`` reports now (0 if none answers)."""
        return max((s["commit_index"] for n in names if (s := self.status(n)) is not None), default=0)

    def catch_up(self, name: str, target: int, timeout: float = 30.0) -> float:
        """Seconds until ``name`` has applied ``target`` (raises TimeoutError after ``timeout``)."""
        started = time.monotonic()
        self.wait_status(name, lambda s: s["applied_index"] >= target, timeout,
                         f"applying index {target}")
        return time.monotonic() - started

    def converge(self, timeout: float = 30.0) -> int:
        """Wait until every node is up, one leads, and all have committed and applied the
        same last index twice in a row; return that index."""
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        agreed = -1
        while time.monotonic() < deadline:
            statuses = {n: self.status(n) for n in self.names}
            last = statuses
            if all(s is not None for s in statuses.values()):
                indexes = {(s["last_index"], s["commit_index"], s["applied_index"])  # type: ignore[index]
                           for s in statuses.values()}
                roles = [s["role"] for s in statuses.values()]  # type: ignore[index]
                if len(indexes) == 1 and roles.count("leader") == 1:
                    (index, commit, applied), = indexes
                    if index == commit == applied:
                        if agreed == index:
                            return index
                        agreed = index
                        time.sleep(0.3)  # and still so a moment later
                        continue
            agreed = -1
            time.sleep(POLL_S)
        raise TimeoutError(f"replicas did not converge within {timeout}s: {last}")

    # -- faults --------------------------------------------------------------------------
    def peer_links_of(self, name: str) -> list[PeerLink]:
        return [pl for pair, pl in self.peer_links.items() if name in pair]

    def isolate(self, name: str, clients: bool = True) -> None:
        """Partition ``name``: its peer links (and client link) swallow bytes both ways."""
        for pl in self.peer_links_of(name):
            pl.link.cut("both")
        if clients:
            self.client_links[name].cut("both")

    def cut_one_way(self, src: str, dst: str) -> None:
        """Bytes from ``src`` to ``dst`` are swallowed; ``dst`` -> ``src`` still flows."""
        pl = self.peer_links[frozenset((src, dst))]
        pl.link.cut(pl.stream_from(src))

    def all_links(self) -> list[Link]:
        return ([pl.link for pl in self.peer_links.values()] + list(self.learner_links.values())
                + list(self.client_links.values()))

    def latency_everywhere(self, ms: int, jitter: int) -> None:
        for link in self.all_links():
            link.latency(ms, jitter, stream="both")

    def heal(self) -> None:
        """Every toxic removed, every proxy enabled and every paused node resumed."""
        self.toxi.reset()
        for name in sorted(self.paused):
            self.resume(name)
