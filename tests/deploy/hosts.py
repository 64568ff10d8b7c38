"""Hosts for the deploy test: one network namespace per host, joined by a bridge.

A *switch* namespace holds a bridge; each host namespace has one veth pair whose one end
(``eth0``, the host's address on the test's private /24) is in the host and whose other
end is a port of the bridge. No interface is created in the root namespace, so nothing the
test starts can reach -- or be reached from -- any address outside the namespaces.

Network namespaces share the file system, so each host also gets its own root directory:
:meth:`Host.path` maps the absolute paths the deploy files use (``/etc/raftmq``,
``/var/lib/raftmq``, ``/opt/raftmq``) to that host's directory (``/opt/raftmq``: the
repository, whose ``.venv`` has RaftMQ installed).

Contracts:

* :class:`Network` creates namespaces whose names carry a per-run id, and :meth:`Network.close`
  stops every process any host started (by PID, SIGKILL after a grace period) and deletes
  every namespace it created -- call it in a ``finally``; it never raises for one failure
  before trying the rest. A constructor that fails (the bridge cannot be made) closes what
  it made before raising, as there is then no object to close.
* :meth:`Host.start` runs ``ip netns exec NS [setpriv ...] ARGV``: both exec, so the
  :class:`ManagedProcess`'s PID is the program's.
* :meth:`Host.listeners` reads the namespace's listening TCP sockets from
  ``/proc/PID/net/tcp{,6}`` of a ``sleep`` anchored in it (no process spawned per read).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.procs import ManagedProcess

__all__ = ["REPO", "Host", "Network", "ServiceUser"]

REPO = Path(__file__).resolve().parents[2]
SUBNET = "10.77.0"
PREFIX = 24


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


@dataclass(frozen=True)
class ServiceUser:
    """The units' ``User=raftmq``: a uid/gid with no other rights (files are ``install -o``'d to it)."""

    uid: int
    gid: int

    def setpriv(self) -> list[str]:
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups"]


def _anchor(ns: str) -> subprocess.Popen[bytes]:
    """A ``sleep`` in namespace ``ns`` whose ``/proc/PID/net`` shows the namespace's sockets."""
    return subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "infinity"], stdin=subprocess.DEVNULL)


def _decode_addr(hex_addr: str) -> tuple[str, int]:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = str(ipaddress.IPv4Address(raw[::-1]))
    else:  # four little-endian 32-bit words
        ip = str(ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))))
    return ip, int(port, 16)


@dataclass
class Host:
    name: str
    ns: str
    ip: str
    root: Path
    network: Network
    anchor: subprocess.Popen[bytes] | None = None
    procs: list[ManagedProcess] = field(default_factory=list)

    def path(self, p: str) -> Path:
        """The deploy files' absolute path ``p`` on this host."""
        if p == "/opt/raftmq" or p.startswith("/opt/raftmq/"):
            return REPO / p.removeprefix("/opt/raftmq").lstrip("/")
        return self.root / p.lstrip("/")

    def localize(self, text: str) -> str:
        """``text`` (a deploy file, a unit's ExecStart) with this host's paths and the test subnet."""
        text = text.replace("/opt/raftmq", str(REPO))
        for d in ("/etc/raftmq", "/var/lib/raftmq", "/etc/prometheus"):
            text = text.replace(d, str(self.path(d)))
        return self.network.localize(text)

    def run(self, argv: Sequence[str], *, timeout: float = 60, input: str | None = None,
            env: Mapping[str, str] | None = None, user: ServiceUser | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """``argv`` in this host's namespace, to completion (output captured)."""
        full = ["ip", "netns", "exec", self.ns, *(user.setpriv() if user else []), *argv]
        return subprocess.run(full, capture_output=True, text=True, timeout=timeout, input=input,
                              env={**os.environ, **(env or {})}, cwd=cwd)

    def start(self, name: str, argv: Sequence[str], *, user: ServiceUser | None = None,
              env: Mapping[str, str] | None = None, cwd: Path | None = None) -> ManagedProcess:
        """``argv`` started in this host's namespace (as ``user``), logging to ``logs/NAME.log``."""
        full = ["ip", "netns", "exec", self.ns, *(user.setpriv() if user else []), *argv]
        proc = ManagedProcess(full, self.network.logs / f"{name}.log", name=name, env=env, cwd=cwd)
        self.procs.append(proc)
        return proc

    def listeners(self) -> set[tuple[str, int]]:
        """Every (address, port) a TCP socket listens on in this namespace."""
        assert self.anchor is not None
        out: set[tuple[str, int]] = set()
        for table in ("tcp", "tcp6"):
            with contextlib.suppress(FileNotFoundError):
                for line in Path(f"/proc/{self.anchor.pid}/net/{table}").read_text().splitlines()[1:]:
                    cols = line.split()
                    if cols[3] == "0A":  # TCP_LISTEN
                        out.add(_decode_addr(cols[1]))
        return out


class Network:
    """The switch and the hosts of one run; ``close()`` removes all of it."""

    def __init__(self, work: Path, logs: Path, subnet: str = SUBNET) -> None:
        self.id = uuid.uuid4().hex[:6]
        self.work = work
        self.logs = logs
        self.subnet = subnet
        self.switch = f"rmq{self.id}-sw"
        self.hosts: dict[str, Host] = {}
        self._namespaces: list[str] = []
        try:
            self._add_ns(self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
        except BaseException:  # the caller gets no object to close: remove what was made
            self.close()
            raise

    def localize(self, text: str) -> str:
        """The docs' addresses (10.0.0.x) as the test subnet's."""
        return text.replace("10.0.0.", f"{self.subnet}.")

    def _add_ns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._namespaces.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def add_host(self, name: str, octet: int) -> Host:
        ns = f"rmq{self.id}-{name}"
        self._add_ns(ns)
        port = f"p{octet}"
        # Both ends are made inside namespaces: nothing appears in the root namespace.
        _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", self.switch, "link", "set", port, "master", "br0")
        _ip("-n", self.switch, "link", "set", port, "up")
        ip = f"{self.subnet}.{octet}"
        _ip("-n", ns, "addr", "add", f"{ip}/{PREFIX}", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        root = self.work / name
        root.mkdir(parents=True, exist_ok=True)
        host = Host(name, ns, ip, root, self, anchor=_anchor(ns))
        self.hosts[name] = host  # with its anchor: the listeners watcher reads every host's
        return host

    def close(self) -> list[str]:
        """Stop every process (by PID), delete every namespace; returns what went wrong."""
        errors: list[str] = []
        for host in self.hosts.values():
            for proc in reversed(host.procs):
                try:
                    proc.stop(5.0)
                except Exception as exc:  # go on with the rest
                    errors.append(f"stopping {proc!r}: {exc!r}")
            if host.anchor is not None and host.anchor.poll() is None:
                host.anchor.kill()
                host.anchor.wait(5)
        for ns in reversed(self._namespaces):
            done = _ip("netns", "delete", ns, check=False)
            if done.returncode != 0:
                errors.append(f"ip netns delete {ns}: {done.stderr.strip()}")
        return errors


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
