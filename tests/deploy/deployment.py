"""docs/DEPLOY.md's 3-host deploy, step by step, on the namespaces of :mod:`tests.deploy.hosts`.

Each step runs the docs' own commands where it can (``openssl`` as docs/SECURITY.md shows,
``raftmq user hash`` with the password typed twice at a terminal, ``raftmq namesrv-key``,
``install -o raftmq ...``, ``raftmq replica init`` as the service user), copies the
``deploy/`` files with their paths and addresses made the host's (:meth:`Host.localize`),
and starts each process with its unit's ``ExecStart`` line, as its unit's ``User=``.

The *operator's machine* is a directory of the root namespace (files only, no network);
the *client* host (``.31``) is where every command that talks to the cluster runs.
"""

from __future__ import annotations

import json
import os
import pty
import re
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.deploy.docs_commands import documented, exported
from tests.deploy.hosts import REPO, Host, Network, ServiceUser
from tests.support.procs import ManagedProcess, wait_until

__all__ = ["ADMIN_PASSWORD", "BROKERS", "NAMESRVS", "Deployment", "deployment_hosts", "parse_cluster_status",
           "unit"]

DEPLOY = REPO / "deploy"
ADMIN_PASSWORD = "admin-deploy-password"
#: name -> (host octet, deploy file); the docs' hosts .11-.13 and .21-.22 (n4, n5: grown to)
BROKERS = {"n1": 11, "n2": 12, "n3": 13, "n4": 14, "n5": 15}
NAMESRVS = {"namesrv1": 21, "namesrv2": 22}
CLIENT_OCTET = 31
RAFTMQ = str(REPO / ".venv" / "bin" / "raftmq")
PYTHON = str(REPO / ".venv" / "bin" / "python")


@dataclass(frozen=True)
class Unit:
    exec_start: str
    user: str | None
    restart_sec: float
    restart: str


def unit(name: str) -> Unit:
    """The ``[Service]`` lines of ``deploy/NAME`` the test follows."""
    fields: dict[str, str] = {}
    for line in (DEPLOY / name).read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            fields.setdefault(key.strip(), value.strip())
    return Unit(fields["ExecStart"], fields.get("User"), float(fields.get("RestartSec", "0.1")),
                fields.get("Restart", "no"))


def _bash(script: str, cwd: Path, timeout: float = 60) -> str:
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{script}\n-> {done.returncode}\n{done.stdout}{done.stderr}"
    return done.stdout


def typed_twice(argv: list[str], password: str, cwd: Path, timeout: float = 30) -> str:
    """Run ``argv`` on a terminal and type ``password`` at each of its two prompts."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: exec at once; it must never return into the caller (pytest)
        try:
            os.chdir(cwd)
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    out = b""
    prompts = 0
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 1024)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
            if out.count(b":") > prompts and prompts < 2 and out.rstrip().endswith(b":"):
                prompts += 1
                os.write(fd, password.encode() + b"\n")
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    text = out.decode(errors="replace")
    code = os.waitstatus_to_exitcode(status)
    assert code == 0 and prompts == 2, f"{argv} exited {code}: {text}"
    return text


class Deployment:
    """The hosts, the files the docs put on them, and the processes of their units."""

    def __init__(self, network: Network, operator: Path, user: ServiceUser) -> None:
        self.net = network
        self.op = operator
        self.user = user
        self.broker_unit = unit("raftmq-broker.service")
        self.namesrv_unit = unit("raftmq-namesrv.service")
        self.services: dict[str, ManagedProcess] = {}
        self.starts: dict[str, int] = {}
        self.client = network.add_host("client", CLIENT_OCTET)
        for name, octet in NAMESRVS.items():
            network.add_host(name, octet)
        for name in ("n1", "n2", "n3"):
            network.add_host(name, BROKERS[name])
        self.seen_listeners: dict[tuple[str, str, int], float] = {}
        self.watch_error: BaseException | None = None
        #: a user with no right to send to ``orders`` (the users test makes it): its credentials file
        self.ungranted: Path | None = None
        self._watch_stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch_listeners, daemon=True, name="listeners")
        self._watcher.start()

    # -- the operator's machine ------------------------------------------------------------
    def make_secret_ca_and_admin(self) -> None:
        """Steps 2, 3 (the super user's record) and 5 (the CA): once, on the operator's machine."""
        _bash("python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > cluster.secret", self.op)
        _bash('openssl ecparam -name prime256v1 -genkey -noout -out ca.key\n'
              'openssl req -x509 -new -key ca.key -sha256 -days 1825 -subj "/CN=RaftMQ CA" -out ca.pem '
              '-addext "basicConstraints=critical,CA:true,pathlen:0" '
              '-addext "keyUsage=critical,keyCertSign,cRLSign"', self.op)
        typed_twice([RAFTMQ, "user", "hash", "admin", "--out", "admin.scram"], ADMIN_PASSWORD, self.op)

    def host_cert(self, host: str, ip: str) -> None:
        """docs/SECURITY.md's per-host certificate, for ``host`` at ``ip``."""
        _bash(f'host={host} ip={ip}\n'
              'openssl ecparam -name prime256v1 -genkey -noout -out $host.key\n'
              'openssl req -new -key $host.key -subj "/CN=$host" -out $host.csr\n'
              'openssl x509 -req -in $host.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 -sha256 '
              '-extfile <(printf "subjectAltName=IP:$ip,DNS:$host.example.internal\\n'
              'extendedKeyUsage=serverAuth,clientAuth") -out $host.pem', self.op)

    # -- installing a host -------------------------------------------------------------------
    def install(self, host: Host, script: str) -> None:
        """``script`` (the docs' ``sudo install ...`` lines) run for ``host``: its paths, the
        service user's numeric ids for ``raftmq``, sudo dropped (the test is root)."""
        text = host.localize(script).replace("sudo ", "")
        text = re.sub(r"-o raftmq -g raftmq", f"-o {self.user.uid} -g {self.user.gid}", text)
        _bash(text, self.op)

    def install_base(self, host: Host) -> None:
        """Step 1's directories."""
        self.install(host, "sudo install -d -o raftmq -g raftmq -m 0750 /var/lib/raftmq /etc/raftmq")

    def install_tls(self, host: Host, cert_name: str | None) -> None:
        files = f"ca.pem {cert_name}.pem" if cert_name else "ca.pem"
        script = ("sudo install -d -o raftmq -g raftmq -m 0750 /etc/raftmq/tls\n"
                  f"sudo install -o raftmq -g raftmq -m 0644 {files} /etc/raftmq/tls/\n")
        if cert_name:
            script += f"sudo install -o raftmq -g raftmq -m 0600 {cert_name}.key /etc/raftmq/tls/\n"
        self.install(host, script)

    def broker_toml(self, name: str, source: str | None = None) -> str:
        """``deploy/broker-nI.toml`` with the host's paths and addresses (n4, n5: n3's file
        with their name, address and certificate, as the docs' "grow" says)."""
        host = self.net.hosts.get(name) or self.net.add_host(name, BROKERS[name])
        text = host.localize((DEPLOY / (source or f"broker-{name}.toml")).read_text())
        if source:
            src = re.search(r'name = "(n\d)"', text)
            assert src
            old = src.group(1)
            text = (text.replace(f'name = "{old}"', f'name = "{name}"')
                    .replace(f'listen = "{self.net.subnet}.{BROKERS[old]}:', f'listen = "{host.ip}:')
                    .replace(f"broker{old[1:]}.", f"broker{name[1:]}."))
        return text

    def install_broker(self, name: str, *, toml: str | None = None) -> Host:
        """Steps 1-3 and 5 on broker host ``name``: directories, secret, config, super user, TLS."""
        host = self.net.hosts.get(name) or self.net.add_host(name, BROKERS[name])
        self.install_base(host)
        (self.op / f"broker-{name}.toml").write_text(toml if toml is not None else self.broker_toml(name))
        owned = "sudo install -o raftmq -g raftmq"
        self.install(host, f"{owned} -m 0600 cluster.secret /etc/raftmq/cluster.secret\n"
                           f"{owned} -m 0640 broker-{name}.toml /etc/raftmq/broker.toml\n"
                           f"{owned} -m 0600 admin.scram /etc/raftmq/admin.scram")
        cert = f"broker{name[1:]}"
        if not (self.op / f"{cert}.pem").exists():
            self.host_cert(cert, host.ip)
        self.install_tls(host, cert)
        return host

    def as_documented(self, host: Host, line: str, timeout: float = 60) -> str:
        """A docs' shell ``line`` run by bash on ``host`` in the operator's directory: its paths
        the host's, ``sudo -u raftmq`` the service user (setpriv), other ``sudo`` dropped."""
        text = host.localize(line).replace("sudo -u raftmq ", " ".join(self.user.setpriv()) + " ")
        text = text.replace("sudo ", "")
        done = host.run(["bash", "-euo", "pipefail", "-c", text], cwd=self.op, timeout=timeout)
        assert done.returncode == 0, f"{text}\n-> {done.returncode}\n{done.stdout}{done.stderr}"
        return done.stdout

    def write_namesrv_key(self) -> None:
        """Step 4, on broker host 1 (it has the secret), as docs/DEPLOY.md writes it: the
        group's registration key, made as the raftmq user, into the operator's 0600 file."""
        self.as_documented(self.net.hosts["n1"], documented("DEPLOY.md", " namesrv-key --config "))
        key = self.op / "g1.namesrv-key"
        assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_text().strip()) == 64, key

    def install_namesrv(self, name: str) -> Host:
        host = self.net.hosts[name]
        self.install_base(host)
        self.install(host, "sudo install -o raftmq -g raftmq -m 0600 g1.namesrv-key "
                           "/etc/raftmq/g1.namesrv-key")
        text = host.localize((DEPLOY / "namesrv.toml").read_text())
        if name != "namesrv1":  # "its listen set to the host's address", its own certificate
            text = (text.replace(f'listen = "{self.net.subnet}.21:', f'listen = "{host.ip}:')
                    .replace("/tls/namesrv1.", f"/tls/{name}."))
        (self.op / f"{name}.toml").write_text(text)
        self.install(host, f"sudo install -o raftmq -g raftmq -m 0640 {name}.toml /etc/raftmq/namesrv.toml")
        self.host_cert(name, host.ip)
        self.install_tls(host, name)
        return host

    def install_client(self) -> None:
        """The client host gets ``ca.pem`` (and the operator's 0600 credentials file)."""
        host = self.client
        self.install(host, "sudo install -d -m 0755 /etc/raftmq/tls\n"
                           "sudo install -m 0644 ca.pem /etc/raftmq/tls/")
        self.client_file("/root/.raftmq-admin", f"admin\n{ADMIN_PASSWORD}\n")

    def replica_init(self, name: str) -> str:
        """Step 7 as docs/DEPLOY.md writes it (``sudo -u raftmq ... replica init ...``)."""
        return self.as_documented(self.net.hosts[name], documented("DEPLOY.md", " replica init --config "))

    # -- the units ---------------------------------------------------------------------------
    def start(self, name: str) -> ManagedProcess:
        """The unit's ExecStart on host ``name``, as its User= (step 8's ``systemctl start``)."""
        host = self.net.hosts[name]
        u = self.namesrv_unit if name.startswith("namesrv") else self.broker_unit
        argv = shlex.split(host.localize(u.exec_start))
        self.starts[name] = self.starts.get(name, 0) + 1
        proc = host.start(f"{name}.{self.starts[name]}", argv, user=self.user if u.user else None)
        self.services[name] = proc
        return proc

    def stop(self, name: str) -> int:
        """``systemctl stop``: SIGTERM (KillSignal), SIGKILL after TimeoutStopSec."""
        return self.services[name].stop(30)

    def form(self) -> None:
        """Steps 1-8 for the three broker hosts and two name servers."""
        self.make_secret_ca_and_admin()
        for name in ("n1", "n2", "n3"):
            self.install_broker(name)
        self.write_namesrv_key()
        for name in NAMESRVS:
            self.install_namesrv(name)
        self.install_client()
        for name in ("n1", "n2", "n3"):
            out = self.replica_init(name)
            assert "formatted as founding storage f-" in out, out
        for name in NAMESRVS:
            self.start(name)
        for name in ("n1", "n2", "n3"):
            self.start(name)

    # -- the client host -----------------------------------------------------------------------
    def client_env(self) -> dict[str, str]:
        """The ``export``s of docs/DEPLOY.md "Operating", read from it, on the client host (root:
        ``~`` is ``/root``)."""
        host = self.client
        path = host.localize(exported("DEPLOY.md", "PATH")).replace("$PATH", os.environ["PATH"])
        creds = exported("DEPLOY.md", "RAFTMQ_CREDENTIALS_FILE").replace("~", "/root", 1)
        return {"PATH": path,
                "RAFTMQ_NAMESRV": host.localize(exported("DEPLOY.md", "RAFTMQ_NAMESRV")),
                "RAFTMQ_CA_FILE": str(host.path(exported("DEPLOY.md", "RAFTMQ_CA_FILE"))),
                "RAFTMQ_CREDENTIALS_FILE": str(host.path(creds))}

    def cli(self, *args: str, env: dict[str, str] | None = None, timeout: float = 60,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """``raftmq ARGS`` on the client host with the docs' environment (``raftmq`` found on
        its ``PATH``)."""
        done = self.client.run(["raftmq", *args], env={**self.client_env(), **(env or {})}, timeout=timeout)
        if check:
            assert done.returncode == 0, \
                f"raftmq {' '.join(args)} -> {done.returncode}\n{done.stdout}{done.stderr}"
        return done

    def curl(self, url: str, *args: str, timeout: float = 10) -> subprocess.CompletedProcess[str]:
        """``curl -s --cacert /etc/raftmq/tls/ca.pem URL`` on the client host (step 9)."""
        ca = str(self.client.path("/etc/raftmq/tls/ca.pem"))
        return self.client.run(["curl", "-s", "--max-time", "5", "--cacert", ca, *args, url], timeout=timeout)

    def client_file(self, path: str, text: str) -> Path:
        """A 0600 file of the client host (a credentials file)."""
        f = self.client.path(path)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
        f.chmod(0o600)
        return f

    def start_load(self, tag: str, min_acked: int = 0) -> tuple[ManagedProcess, Path, Path]:
        """``ordered_load.py`` started on the client host: shipper sends, billing consumes.
        Returns (process, stop file, result file)."""
        stop, out = self.client.path(f"/root/{tag}.stop"), self.client.path(f"/root/{tag}.json")
        argv = [PYTHON, str(Path(__file__).parent / "ordered_load.py"),
                str(self.client.path("/root/shipper.credentials")),
                str(self.client.path("/root/billing.credentials")), str(stop), str(out),
                "--min", str(min_acked)]
        proc = self.client.start(f"load-{tag}", argv, env={**self.client_env(), "PYTHONPATH": str(REPO)},
                                 cwd=REPO)
        return proc, stop, out

    def finish_load(self, load: tuple[ManagedProcess, Path, Path], timeout: float = 150) -> dict[str, Any]:
        proc, stop, out = load
        stop.touch()
        code = proc.wait(timeout)
        assert code == 0 and out.exists(), f"ordered load exited {code}:\n{proc.log_tail()}"
        return dict(json.loads(out.read_text()))

    def ordered_load(self, min_acked: int) -> dict[str, Any]:
        load = self.start_load(f"load{len(self.client.procs)}", min_acked)
        return self.finish_load(load)

    def cluster_status(self) -> dict[str, dict[str, str]]:
        """``raftmq cluster status --namesrv 10.0.0.21:9876`` on the client host, as the
        operator reads it: node -> its columns (``role`` "DOWN" for a replica that did not
        answer)."""
        out = self.cli("cluster", "status", "--namesrv", f"{self.net.subnet}.21:9876").stdout
        return parse_cluster_status(out)

    def status(self, name: str) -> dict[str, Any] | None:
        """A replica's ``/status`` over https from the client host (None: no answer)."""
        done = self.curl(f"https://{self.net.hosts[name].ip}:10911/status")
        if done.returncode != 0 or not done.stdout:
            return None
        return dict(json.loads(done.stdout))

    def wait_registered(self, names: tuple[str, ...] = ("n1", "n2", "n3"), timeout: float = 40) -> None:
        """Both name servers' ``/cluster`` (step 9) list every replica of ``names``."""
        for ns in NAMESRVS.values():
            def registered(ns: int = ns) -> bool:
                done = self.curl(f"https://{self.net.subnet}.{ns}:9876/cluster")
                text = done.stdout if done.returncode == 0 else ""
                return all(f'"{n}"' in text for n in names)
            wait_until(registered, timeout, 0.5, f"{names} registered with name server .{ns}")

    def wipe(self, name: str) -> None:
        """A host's disk lost: its ``/var/lib/raftmq`` empty again (as step 1 made it)."""
        host = self.net.hosts[name]
        shutil.rmtree(host.path("/var/lib/raftmq"))
        self.install_base(host)

    def leader(self, names: list[str], timeout: float = 30) -> str:
        """The leader every replica of ``names`` answers with (each must answer)."""
        def find() -> str | None:
            statuses = [self.status(n) for n in names]
            said = {s.get("leader") if s else None for s in statuses}
            leader = said.pop() if len(said) == 1 else None
            return leader if leader in names and statuses[names.index(leader)]["role"] == "leader" else None
        return wait_until(find, timeout, 0.3, f"one leader all of {names} follow")

    def python(self, script: str, *args: str, timeout: float = 120) -> Any:
        """``script`` (a file of tests/deploy) run with the venv's Python on the client host;
        its last stdout line is JSON."""
        done = self.client.run([PYTHON, str(Path(__file__).parent / script), *args],
                               env={**self.client_env(), "PYTHONPATH": str(REPO)}, timeout=timeout,
                               cwd=REPO)
        assert done.returncode == 0, f"{script} -> {done.returncode}\n{done.stdout}{done.stderr}"
        return json.loads(done.stdout.strip().splitlines()[-1])

    def log_mark(self, name: str) -> tuple[Path, int]:
        """Where the log of ``name``'s current process ends now (for :meth:`log_since`)."""
        path = self.services[name].log_path
        return path, path.stat().st_size if path.exists() else 0

    @staticmethod
    def log_since(mark: tuple[Path, int]) -> str:
        path, offset = mark
        with path.open("rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")

    # -- the listening-sockets rule ----------------------------------------------------------------
    @property
    def watching(self) -> bool:
        """The listening-sockets watcher is still sampling (it stops on an error: ``watch_error``)."""
        return self._watcher.is_alive() and not self._watch_stop.is_set()

    def _watch_listeners(self) -> None:
        try:
            while not self._watch_stop.wait(0.2):
                self.sample_listeners()
        except BaseException as exc:
            self.watch_error = exc
            raise

    def sample_listeners(self) -> None:
        for host in list(self.net.hosts.values()):
            for ip, port in host.listeners():
                self.seen_listeners.setdefault((host.name, ip, port), time.monotonic())

    def close(self) -> None:
        self._watch_stop.set()
        self._watcher.join(5)


def parse_cluster_status(out: str) -> dict[str, dict[str, str]]:
    """The rows of ``raftmq cluster status`` (``raftmq/cluster_cmd.py``): node -> {group,
    address, role, term, commit, applied, health} (a DOWN replica: its role "DOWN")."""
    rows: dict[str, dict[str, str]] = {}
    for line in out.splitlines():
        cols = line.split()
        if len(cols) < 4 or cols[0] == "group" or ":" not in cols[2]:
            continue
        row = {"group": cols[0], "address": cols[2], "role": cols[3]}
        if cols[3] != "DOWN":
            row.update(term=cols[4], commit=cols[5], applied=cols[6], health=" ".join(cols[11:]))
        rows[cols[1]] = row
    return rows


@contextmanager
def deployment_hosts(work: Path, logs: Path, operator: Path, user: ServiceUser) -> Iterator[Deployment]:
    """A :class:`Deployment` on a new :class:`Network`; on leaving -- also when making the
    network or the hosts fails -- every process stopped, every namespace deleted, ``work``
    removed."""
    network: Network | None = None
    deployment: Deployment | None = None
    try:
        network = Network(work / "hosts", logs)
        deployment = Deployment(network, operator, user)
        yield deployment
    finally:
        if deployment is not None:
            deployment.close()
        errors = network.close() if network is not None else []
        shutil.rmtree(work, ignore_errors=True)
        assert not errors, errors
