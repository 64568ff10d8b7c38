"""Start, kill and inspect a local group of log nodes (``python -m dledger``) on 127.0.0.1.

Used by ``scripts/run``, ``scripts/bench-log`` and the multi-process tests. Every
node is a separate process whose PID is kept; ``stop()`` ends them all by PID.
Node configs, the generated cluster secret, data and logs live under ``base``::

    base/cluster.json      the nodes' Raft and HTTP addresses (reused when the group restarts)
    base/secret            generated once (mode 0600), shared by the nodes
    base/n1.toml ...       node configs
    base/n1/               data directory of n1 (commitlog/, raft-state, applied.log)
    base/n1.log            stdout/stderr of n1
    base/tls/              with ``tls=True``: the local CA and certificates (``raftmq.local_tls``)
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import msgspec

from dledger.raft.storage_identity import StorageIdentityError, format_founder
from raftmq.cluster_http import ClusterHttp
from raftmq.local_tls import LocalCA

__all__ = ["LocalGroup", "NodeDiedError", "NodeProc", "free_port"]


_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A port free on 127.0.0.1, chosen BELOW the kernel's ephemeral range.

    A port taken with bind(0) comes from the ephemeral range, where any outgoing
    connection or other bind(0) (a Toxiproxy listener) may grab it before the
    node that was meant to listen there starts. Below that range only explicit
    binds compete. Never hands out the same port twice in one process.
    """
    lo_ephemeral, _ = _ephemeral_range()
    low, high = 20000, max(20001, lo_ephemeral)
    if lo_ephemeral <= low:  # an unusual kernel setting: fall back to bind(0)
        low, high = 0, 0
    for _ in range(200):
        port = random.randrange(low, high) if high else 0
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = s.getsockname()[1]
        _handed_out.add(port)
        return port
    raise RuntimeError("no free port found on 127.0.0.1")


class NodeDiedError(RuntimeError):
    """A node the caller meant to stop had already exited on its own (a crash): it says
    which, with its exit status and the tail of its log."""


@dataclass
class NodeProc:
    name: str
    raft: str
    http: str
    proc: subprocess.Popen[bytes] | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class LocalGroup:
    """A group of ``n`` log nodes under ``base`` (module docstring)."""

    def __init__(self, base: Path, n: int = 3, *, raft: dict[str, Any] | None = None,
                 dial: dict[str, dict[str, str]] | None = None, log_level: str = "INFO",
                 module: str = "dledger", broker: dict[str, Any] | None = None,
                 group: str = "g1", entry: str | None = None, tls: bool | LocalCA = False,
                 mutual_tls: bool = False) -> None:
        """``module`` is what each node runs: ``dledger`` (a log node) or ``broker``
        (then ``broker`` holds extra [broker] settings); ``entry`` the module started
        with ``python -m`` (default: ``module``). ``tls`` (brokers only): serve TLS with
        certificates of a local CA under ``base/tls`` (or of the one given); ``mutual_tls``:
        clients must present a certificate of it. ``client_tls`` is what a client needs."""
        if (tls or mutual_tls) and module != "broker":
            raise ValueError("tls is for broker groups")
        ca = tls if isinstance(tls, LocalCA) else LocalCA(base / "tls") if tls or mutual_tls else None
        self.ca = ca.ensure() if ca is not None else None
        self.mutual_tls = mutual_tls
        self.client_tls = self.ca.client_tls(with_cert=mutual_tls) if self.ca is not None else None
        self.http = ClusterHttp.with_tls(self.client_tls)
        self.base = base
        self.module = module
        self.entry = entry or module
        self.broker_options = broker or {}
        self.group = group
        self.base.mkdir(parents=True, exist_ok=True)
        self.raft_options = raft or {}
        self.log_level = log_level
        self.nodes: dict[str, NodeProc] = {}
        #: the processes that exited on their own (not by ``kill``/``terminate``/``stop``):
        #: "<node> (pid P) died on its own with exit status S; its log ends: ..."
        self.deaths: list[str] = []
        self._stopped: set[subprocess.Popen[bytes]] = set()  # the processes this group stopped
        names = [f"n{i + 1}" for i in range(n)]
        layout = base / "cluster.json"
        known = json.loads(layout.read_text()) if layout.exists() else {}
        for name in names:
            raft, http = known.get(name) or (f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}")
            self.nodes[name] = NodeProc(name, raft, http)
        layout.write_text(json.dumps({n: [p.raft, p.http] for n, p in self.nodes.items()}))
        secret_path = base / "secret"
        if not secret_path.exists():
            secret_path.write_text(secrets.token_urlsafe(32))
            secret_path.chmod(0o600)
        for name in names:
            self.write_config(name, (dial or {}).get(name, {}))
        if not known:  # a new group: its replicas are formed as founders (raftmq replica init)
            for name in names:
                self.init_storage(name)

    def init_storage(self, name: str) -> None:
        """Format ``name``'s data directory as a founding storage of a new group unless it is
        formatted already (``raftmq replica init``). A wiped replica restarted without it
        comes back as a new storage of the existing group, as a replaced host does."""
        with contextlib.suppress(StorageIdentityError):  # formatted already, or holding state
            format_founder(self.base / name)

    # -- configuration ---------------------------------------------------------
    def add_node(self, name: str, members: list[str]) -> NodeProc:
        """A new node (fresh addresses, not started) that joins as a learner: its config
        lists ``members`` and itself, with ``join = true``."""
        if name in self.nodes:
            raise ValueError(f"{name} exists")
        self.nodes[name] = NodeProc(name, f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}")
        layout = self.base / "cluster.json"
        layout.write_text(json.dumps({n: [p.raft, p.http] for n, p in self.nodes.items()}))
        self.write_config(name, {}, peers=[*members, name], join=True)
        return self.nodes[name]

    def write_config(self, name: str, dial: dict[str, str], *, peers: list[str] | None = None,
                     join: bool = False) -> Path:
        """(Re)write ``name``'s TOML; ``dial`` maps peers to proxy addresses; ``peers``
        (default: every node) the initial member set."""
        listed = {p: self.nodes[p] for p in (peers or self.nodes)}
        peer_list = ", ".join(f'{p} = "{n.raft}"' for p, n in listed.items())
        lines = ["[node]", f'name = "{name}"', f'data_dir = "{name}"', "",
                 "[group]", f'name = "{self.group}"', f"peers = {{ {peer_list} }}", 'secret_file = "secret"']
        if join:
            lines.append("join = true")
        if dial:
            lines.append("dial = { " + ", ".join(f'{p} = "{a}"' for p, a in dial.items()) + " }")
        lines += ["", "[raft]"] + [f"{k} = {json.dumps(v)}" for k, v in self.raft_options.items()]
        if self.module == "broker":  # the broker serves clients on the node's HTTP address
            addresses = ", ".join(f'{p} = "{n.http}"' for p, n in listed.items())
            lines += ["", "[broker]", f'listen = "{self.nodes[name].http}"',
                      f"addresses = {{ {addresses} }}"]
            lines += [f"{k} = {json.dumps(v)}" for k, v in self.broker_options.items()]
            if self.ca is not None:
                tls = msgspec.structs.asdict(self.ca.server_tls(client_auth=self.mutual_tls))
                lines += ["", "[broker.tls]", *(f"{k} = {json.dumps(v)}" for k, v in tls.items())]
        path = self.base / f"{name}.toml"
        path.write_text("\n".join(lines) + "\n")
        return path

    # -- processes -------------------------------------------------------------
    def start(self) -> LocalGroup:
        for name in self.nodes:
            self.start_node(name)
        return self

    def start_node(self, name: str, *extra: str) -> NodeProc:
        node = self.nodes[name]
        if node.alive:
            raise RuntimeError(f"{name} is already running (pid {node.proc.pid})")  # type: ignore[union-attr]
        out = open(self.base / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        node.proc = subprocess.Popen(
            [sys.executable, "-m", self.entry, "--config", str(self.base / f"{name}.toml"),
             *(["--http", node.http] if self.module == "dledger" else []),
             "--log-level", self.log_level, *extra],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        return node

    def kill(self, name: str) -> None:
        """SIGKILL ``name`` and reap it. Raises NodeDiedError if its process had already
        exited on its own (a kill -9 of a dead node tests nothing; the crash is the news)."""
        node = self.nodes[name]
        if self._unstoppable(name):
            return
        assert node.proc is not None
        self._stopped.add(node.proc)
        os.kill(node.proc.pid, signal.SIGKILL)
        node.proc.wait(timeout=10)

    def terminate(self, name: str, timeout: float = 10.0) -> None:
        """SIGTERM ``name`` (SIGKILL after ``timeout``) and reap it. Raises NodeDiedError
        if its process had already exited on its own."""
        node = self.nodes[name]
        if self._unstoppable(name):
            return
        assert node.proc is not None
        self._stopped.add(node.proc)
        node.proc.terminate()
        try:
            node.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(node.proc.pid, signal.SIGKILL)
            node.proc.wait(timeout=10)

    def _unstoppable(self, name: str, raise_death: bool = True) -> bool:
        """True if ``name`` has no process to stop: none started, or this group stopped it
        already. One that exited on its own is recorded in ``deaths`` (once) and raised
        as NodeDiedError (unless ``raise_death`` is false)."""
        proc = self.nodes[name].proc
        if proc is None or proc in self._stopped:
            return True
        status = proc.poll()
        if status is None:
            return False
        self._stopped.add(proc)  # recorded once
        death = (f"{name} (pid {proc.pid}) died on its own with exit status {status}; its log ends:\n"
                 f"{self.log_tail(name, 20)}")
        self.deaths.append(death)
        if raise_death:
            raise NodeDiedError(death)
        return True

    def died_on_its_own(self, name: str) -> str | None:
        """Why ``name`` is down if it exited without being stopped (recorded in ``deaths``),
        else None (running, never started, or stopped by this group)."""
        self._unstoppable(name, raise_death=False)
        proc = self.nodes[name].proc
        return next((d for d in self.deaths if proc is not None and d.startswith(f"{name} (pid {proc.pid})")),
                    None)

    def stop(self) -> None:
        """Stop every node by PID (SIGTERM, then SIGKILL after 10 s); one that had died on
        its own is recorded in ``deaths``, and the others are still stopped."""
        for name in self.nodes:
            if not self._unstoppable(name, raise_death=False):
                self.terminate(name)

    def __enter__(self) -> LocalGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.base / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    # -- HTTP control API ------------------------------------------------------
    def _get(self, name: str, path: str, timeout: float = 2.0) -> bytes:
        url = f"http://{self.nodes[name].http}{path}"
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.read()

    def url(self, name: str, path: str) -> str:
        """``path`` on ``name``'s HTTP port (https when the group serves TLS)."""
        return self.http.url(self.nodes[name].http, path)

    def status(self, name: str, timeout: float = 2.0) -> dict[str, Any] | None:
        try:
            return dict(self.http.get(self.nodes[name].http, "/status", timeout))
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def propose(self, name: str, payload: bytes, timeout: float = 15.0) -> tuple[int, dict[str, Any]]:
        """POST /propose; returns (HTTP status, JSON body). Network errors raise OSError."""
        req = urllib.request.Request(f"http://{self.nodes[name].http}/propose", data=payload,
                                     method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def entries(self, name: str, start: int = 1, max_bytes: int = 8 << 20) -> list[list[Any]]:
        return msgpack.unpackb(self._get(name, f"/entries?from={start}&max_bytes={max_bytes}", 10))

    def all_entries(self, name: str) -> list[list[Any]]:
        out: list[list[Any]] = []
        while True:
            chunk = self.entries(name, (out[-1][0] + 1) if out else 1)
            if not chunk:
                return out
            out.extend(chunk)

    def wait_leader(self, timeout: float = 20.0, among: list[str] | None = None) -> str:
        """The name of the first live node that reports itself leader within ``timeout``."""
        deadline = time.monotonic() + timeout
        names = among or list(self.nodes)
        while time.monotonic() < deadline:
            for name in names:
                if not self.nodes[name].alive:
                    continue
                s = self.status(name, timeout=1.0)
                if s and s["role"] == "leader":
                    return name
            time.sleep(0.05)
        raise TimeoutError(f"no leader among {names} within {timeout}s\n{self._election_report(names)}")

    _ELECTION_FIELDS = ("role", "term", "leader", "commit_index", "last_index", "voter", "vote_refusal",
                        "pre_vote_rounds", "pre_vote_won", "peers_connected", "storages_catching_up")

    def _election_report(self, names: list[str]) -> str:
        """What each node says about elections (its status's election fields, or why none)
        and the tail of its log: what a failed wait for a leader is judged by."""
        parts = []
        for n in list(self.nodes):
            s = self.status(n, timeout=1.0) if self.nodes[n].alive else None
            said = ({k: s.get(k) for k in self._ELECTION_FIELDS} if s is not None
                    else "not running" if not self.nodes[n].alive else "no status answer")
            tail = f"\n{self.log_tail(n, 10)}" if n in names else ""
            parts.append(f"--- {n}: {said}{tail}")
        return "\n".join(parts)

    def wait_following(self, leader: str, timeout: float = 20.0,
                       among: list[str] | None = None) -> int:
        """Wait until every live node of ``among`` (default: all) names ``leader`` in the
        leader's term -- each has heard an append of that term -- and return the term.
        A test that cuts, isolates or kills a node to compare its term or log with the
        leader's waits for this first: ``wait_leader`` returns as soon as the leader won,
        before its first append reached anyone."""
        status = self.status(leader, timeout=1.0)
        if status is None or status["role"] != "leader":
            raise TimeoutError(f"{leader} is not the leader: {status}")
        term = int(status["term"])
        for name in among or list(self.nodes):
            if name != leader and self.nodes[name].alive:
                self.wait_status(name, lambda s: s["leader"] == leader and s["term"] == term,
                                 timeout, f"following {leader} in term {term}")
        return term

    def wait_status(self, name: str, predicate: Any, timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            last = self.status(name, timeout=1.0)
            if last is not None and predicate(last):
                return last
            time.sleep(0.05)
        raise TimeoutError(f"{name}: {what} not reached within {timeout}s; last status {last}")
