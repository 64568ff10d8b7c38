"""docs/DEPLOY.md followed word for word on five hosts and a client, in network namespaces.

The hosts (``tests/deploy/hosts.py``): brokers n1-n3 at .11-.13 (n4, n5 at .14-.15 when the
group grows), name servers at .21-.22, the client at .31, on a private /24 (10.77.0.0/24)
made by the test; the docs' ``10.0.0.x`` are read as ``10.77.0.x``. Namespaces share the
file system, so each host has its own root directory and the absolute paths of the deploy
files and units are that host's: ``/etc/raftmq`` and ``/var/lib/raftmq`` -> ``HOSTROOT/etc/raftmq``,
``HOSTROOT/var/lib/raftmq``; ``/opt/raftmq`` -> this repository (its ``.venv`` is the install).
Nothing else in the copied files is changed. Each process is its unit's ``ExecStart`` line from
``deploy/*.service`` (no systemd), run with ``ip netns exec`` as the unit's ``User=`` (a uid of
its own: ``raftmq`` if the machine has that user). The commands docs/DEPLOY.md says run as
written are read from its ``bash`` blocks (``tests.deploy.docs_commands``); each test's
timings go to the run's closing summary (``tests.deploy.timings``).

The tests run in file order on one deployment (``conftest.deployed``).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.deploy.deployment import BROKERS, DEPLOY, RAFTMQ, Deployment
from tests.deploy.docs_commands import documented
from tests.deploy.timings import record
from tests.support.procs import wait_until

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

BROKER_PORT = 10911
RAFT_PORT = 20911
NAMESRV_PORT = 9876


def test_the_group_forms_as_documented_and_serves_status_over_tls(deployed: Deployment) -> None:
    t0 = time.monotonic()
    deployed.form()
    leader = deployed.leader(["n1", "n2", "n3"], timeout=40)
    statuses = {n: deployed.status(n) for n in ("n1", "n2", "n3")}
    for status in statuses.values():
        assert status is not None
        assert status["storage"].startswith("f-"), status
        assert status.get("voter", True), status
    assert statuses[leader]["role"] == "leader"
    deployed.wait_registered(timeout=40)  # step 9's second check: every replica with each name server
    check_listeners(deployed, all_up=True)
    record("form", f"formed, registered and probed in {time.monotonic() - t0:.1f}s, leader {leader}")
    for name, proc in deployed.services.items():  # the units' User=raftmq
        status = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
        uid = next(line.split()[1] for line in status if line.startswith("Uid:"))
        assert int(uid) == deployed.user.uid, (name, uid)


def check_listeners(deployed: Deployment, all_up: bool = False) -> None:
    """Nothing listens off loopback but a broker's TLS+ACL client port and its Raft port
    (the cluster secret) and a name server's TLS port, and each port refuses a stranger:
    https with the CA answers, plain http gets no HTTP answer at all (curl's code 000),
    ``/admin`` without a token is 401, a client send without credentials is AUTH_FAILED and
    one by a user without the grant (once the users test made one) is refused; a TCP
    connection to the Raft port that does not know the secret gets no byte and is closed."""
    assert deployed.watching, f"the listening-sockets watcher stopped: {deployed.watch_error!r}"
    deployed.sample_listeners()
    subnet = deployed.net.subnet
    expected = {}
    for name, host in deployed.net.hosts.items():
        if name.startswith("n") and name[1:].isdigit():
            expected[(name, host.ip, BROKER_PORT)] = "broker"
            expected[(name, host.ip, RAFT_PORT)] = "raft"
        elif name.startswith("namesrv"):
            expected[(name, host.ip, NAMESRV_PORT)] = "namesrv"
    loopback = ("127.", "::1")
    off = {k for k in deployed.seen_listeners if not k[1].startswith(loopback)}
    unexpected = sorted(k for k in off if k not in expected)
    assert not unexpected, f"listening off loopback and not a protected port: {unexpected}"
    assert all(k[1].startswith(f"{subnet}.") for k in off), off
    assert not all_up or set(expected) <= off, f"not listening: {set(expected) - off}"
    listening = {k: kind for k, kind in expected.items() if k[1:] in deployed.net.hosts[k[0]].listeners()}
    for (name, ip, port), kind in listening.items():  # a stopped process's port was probed before
        if kind == "raft":
            assert "secret_file" in deployed.net.hosts[name].path("/etc/raftmq/broker.toml").read_text()
            continue
        ok = deployed.curl(f"https://{ip}:{port}/healthz" if kind == "broker" else f"https://{ip}:{port}/cluster")
        assert ok.returncode == 0, (name, port, ok.stderr)
        plain = deployed.curl(f"http://{ip}:{port}/status", "-o", "/dev/null", "-w", "%{http_code}")
        assert plain.stdout == "000" and plain.returncode != 0, \
            f"{name}:{port} answered plain http: {plain.stdout} (curl exit {plain.returncode})"
        if kind == "broker":
            admin = deployed.curl(f"https://{ip}:{port}/admin/topics", "-o", "/dev/null",
                                  "-w", "%{http_code}")
            assert admin.stdout == "401", f"{name}: /admin/topics without a token -> {admin.stdout}"
    _probe_as_a_stranger(deployed, listening)
    assert deployed.watching, f"the listening-sockets watcher stopped: {deployed.watch_error!r}"


def _probe_as_a_stranger(deployed: Deployment, listening: dict[tuple[str, str, int], str]) -> None:
    """``port_probes.py`` from the client host against every listening broker and Raft port."""
    brokers = {f"{ip}:{port}": name for (name, ip, port), kind in listening.items() if kind == "broker"}
    raft = {f"{ip}:{port}": name for (name, ip, port), kind in listening.items() if kind == "raft"}
    ungranted = str(deployed.ungranted) if deployed.ungranted else None
    probes = deployed.python("port_probes.py", json.dumps({"brokers": sorted(brokers), "raft": sorted(raft),
                                                          "ungranted": ungranted}))
    for address, name in brokers.items():
        answers = probes["brokers"][address]
        anonymous = answers["anonymous"]
        assert anonymous.get("code") == "AUTH_FAILED" and "authentication required" in anonymous["remark"], \
            (name, anonymous)
        if ungranted is None:
            continue
        refused = answers["ungranted"]
        user = deployed.ungranted.read_text().split()[0] if deployed.ungranted else ""
        if _group_of(deployed, name) == "g1":  # the user exists there: the send is what is refused
            assert refused.get("code") == "NO_PERMISSION" and \
                f"user '{user}' may not pub on topic:orders" in refused["remark"], (name, refused)
        else:  # another group's replica (the mistakes test's g2): no such user, the login is refused
            assert refused.get("login_refused") == "AUTH_FAILED", (name, refused)
    for address, name in raft.items():
        for how, probe in probes["raft"][address].items():
            assert probe["received"] == 0 and probe["ended"] in ("eof", "reset"), (name, how, probe)


def _group_of(deployed: Deployment, name: str) -> str:
    toml = deployed.net.hosts[name].path("/etc/raftmq/broker.toml").read_text()
    found = re.search(r'\[group\]\s*name = "([^"]+)"', toml)
    assert found, toml
    return found.group(1)


def test_the_super_user_adds_users_and_grants_and_a_normal_user_sends_and_consumes_in_order(
        deployed: Deployment) -> None:
    """docs/SECURITY.md "Setting up users on the 3-host deploy" from the client host: the
    bootstrap super user (``RAFTMQ_CREDENTIALS_FILE``) creates the topic (docs/DEPLOY.md
    "Create a topic"), users ``billing`` and ``shipper`` and the docs' grants; ``shipper``
    sends ordered messages and ``billing`` consumes them (history verifier: none lost or
    duplicated, order held per key)."""
    t0 = time.monotonic()
    subnet = deployed.net.subnet
    deployed.cli("topic", "create", "orders", "--queues", "8", "--namesrv", f"{subnet}.21:9876")
    for user in ("billing", "shipper"):
        line = documented("SECURITY.md", f"raftmq user add {user}")  # RAFTMQ_NEW_PASSWORD=... raftmq ...
        assert line.startswith("RAFTMQ_NEW_PASSWORD="), line
        out = deployed.cli(*shlex.split(line)[2:], env={"RAFTMQ_NEW_PASSWORD": f"{user}-password"}).stdout
        assert f"user {user} added" in out, out
        deployed.client_file(f"/root/{user}.credentials", f"{user}\n{user}-password\n")
    for needle in ("acl grant billing topic:orders", "acl grant billing group:billing",
                   "acl grant shipper topic:orders", "raftmq acl list"):
        # the docs' "--source 10.0.1.0/24" is the shippers' network: here the client's /24
        line = documented("SECURITY.md", needle)
        args = [a.replace("10.0.1.0/24", f"{subnet}.0/24") for a in shlex.split(line)]
        assert args[0] == "raftmq", args
        out = deployed.cli(*args[1:]).stdout
    assert "billing" in out and "shipper" in out, out  # acl list
    deployed.ungranted = deployed.client.path("/root/billing.credentials")  # sub on orders, no pub
    _applied_everywhere(deployed)  # each replica knows the users before they are probed there
    check_listeners(deployed)
    result = deployed.ordered_load(min_acked=300)
    assert_history(result)
    assert result["figures"]["acked"] >= 300 and result["send_errors"] == 0, result
    record("users", f"users, grants, stranger probes, {result['figures']['acked']} ordered sends consumed "
                    f"in {time.monotonic() - t0:.1f}s")


def _applied_everywhere(deployed: Deployment, names: tuple[str, ...] = ("n1", "n2", "n3")) -> None:
    """Every replica of ``names`` has applied what the leader had committed when this was called."""
    leader = deployed.status(deployed.leader(list(names)))
    assert leader is not None
    commit = int(leader["commit_index"])
    wait_until(lambda: all((s := deployed.status(n)) and s["applied_index"] >= commit for n in names),
               30, 0.3, f"{names} applied index {commit}")


def assert_history(result: dict[str, object]) -> None:
    figures = result["figures"]
    assert isinstance(figures, dict)
    assert not result["problems"], result
    assert figures["lost"] == 0 and figures["duplicated"] == 0 and figures["out_of_order"] == 0, result


def test_mistakes_in_copied_files_give_the_documented_error_quickly(deployed: Deployment) -> None:
    """A wrong registration key on a name server, a missing CA file on a broker host, and a
    ``group.peers`` that differs between two hosts each show a clear error within seconds."""
    t0 = time.monotonic()
    subnet = deployed.net.subnet
    leader = deployed.leader(["n1", "n2", "n3"])
    victim = next(n for n in ("n3", "n2", "n1") if n != leader)
    ns2 = deployed.net.hosts["namesrv2"]

    # 1. a registration key derived from another secret, installed on name server 2
    _bash_op(deployed, "python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > old.secret\n"
                       f"{RAFTMQ} namesrv-key --group g1 --secret-file old.secret --out wrong.namesrv-key")
    key_line = "sudo install -o raftmq -g raftmq -m 0600 {}.namesrv-key /etc/raftmq/g1.namesrv-key"
    deployed.install(ns2, key_line.format("wrong"))
    deployed.stop("namesrv2")
    deployed.start("namesrv2")

    # 2. the CA file missing on a broker host: the broker refuses to start, naming it
    host = deployed.net.hosts[victim]
    deployed.stop(victim)
    host.path("/etc/raftmq/tls/ca.pem").unlink()
    t_ca = time.monotonic()
    proc = deployed.start(victim)
    code = proc.wait(20)
    assert code == 2, proc.log_tail()
    assert f"error: broker.tls.ca_file {host.path('/etc/raftmq/tls/ca.pem')}: [Errno 2] No such file" \
        in proc.log_tail(), proc.log_tail()
    ca_s = time.monotonic() - t_ca
    deployed.install_tls(host, f"broker{victim[1:]}")
    proc = deployed.start(victim)  # a starting broker registers at once: with name server 2 too

    # ... which refuses it, and both sides say why (DEPLOY.md step 4's lines; the name server
    # logs a reason once a minute: the first broker refused may be another than the victim)
    said = re.compile(rf"refused a registration from {re.escape(subnet)}\.1[1-3](:\d+)?: "
                      r"\(401 bad signature\) ")
    wait_until(lambda: said.search(deployed.services["namesrv2"].log_tail(200)),
               20, 0.3, "name server 2 logging the refused registration: (401 bad signature)")
    wait_until(lambda: f"name server {subnet}.22:9876 refused the registration: 401" in proc.log_tail(200),
               20, 0.3, f"{victim} logging name server 2's refusal")
    key_s = time.monotonic() - t_ca
    deployed.install(ns2, key_line.format("g1"))
    deployed.stop("namesrv2")
    deployed.start("namesrv2")

    # 3. peers that differ: a new group g2 on two spare hosts, n4's file naming n5 at a wrong
    # port. pysyncobj dials only peers of a lower address: n5 dials n4, which refuses it.
    t_peers = time.monotonic()
    spare = {}
    for name in ("n4", "n5"):
        text = deployed.broker_toml(name, source="broker-n3.toml")
        peers = f'peers = {{ n4 = "{subnet}.14:20911", n5 = "{subnet}.15:20911" }}'
        text = re.sub(r"peers = \{[^}]*\}", peers, text).replace('name = "g1"', 'name = "g2"')
        text = text.replace("namesrv = [", "namesrv = [] # [")
        if name == "n4":
            text = text.replace(f'n5 = "{subnet}.15:20911"', f'n5 = "{subnet}.15:20912"')
        deployed.install_broker(name, toml=text)
        deployed.replica_init(name)
        spare[name] = deployed.start(name)
    said = f"refused a Raft peer introducing itself as {subnet}.15:20911"
    wait_until(lambda: said in spare["n4"].log_tail(200), 20, 0.3,
               "n4 naming the peer its group.peers does not list")
    status = deployed.status("n5")
    assert status is not None and status["peers_connected"] == {"n4": False}, status
    peers_s = time.monotonic() - t_peers
    _applied_everywhere(deployed)  # the restarted victim knows the users again
    check_listeners(deployed)  # g2's replicas too: their ports refuse strangers as g1's do
    for name in ("n4", "n5"):  # the spare hosts are made again when the group grows
        deployed.stop(name)
        deployed.wipe(name)
    deployed.wait_registered(timeout=40)
    record("mistakes", f"missing CA: exit 2 after {ca_s:.1f}s; wrong key: refusals logged {key_s:.1f}s after "
                       f"the broker's start; differing peers: named after {peers_s:.1f}s; "
                       f"{time.monotonic() - t0:.1f}s in all")


def _bash_op(deployed: Deployment, script: str) -> None:
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=deployed.op, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr


def _verify(deployed: Deployment, names: tuple[str, ...] = ("n1", "n2", "n3")) -> None:
    """Every replica caught up and voting, then ``raftmq cluster verify --namesrv NS`` exits 0."""
    def caught_up() -> bool:
        statuses = [deployed.status(n) for n in names]
        if not all(statuses):
            return False
        commit = max(s["commit_index"] for s in statuses if s)
        return all(s["applied_index"] >= commit and s["voter"] and s["healthy"] for s in statuses if s)
    wait_until(caught_up, 60, 0.5, f"{names} caught up, voting and healthy")
    ns = f"{deployed.net.subnet}.21:9876"
    done = wait_until(lambda: (lambda d: d if d.returncode == 0 else None)(
        deployed.cli("cluster", "verify", "--namesrv", ns, check=False)), 60, 1.0, "cluster verify exit 0")
    assert "OK" in done.stdout or done.returncode == 0, done.stdout


def _under_load(deployed: Deployment, tag: str, procedure: Callable[[], None]) -> dict[str, object]:
    """``procedure`` while shipper sends ordered messages; the history verifier's verdict."""
    load = deployed.start_load(tag)
    try:
        time.sleep(3)  # the load under way
        procedure()
        time.sleep(2)  # sends after the procedure, too
    finally:
        result = deployed.finish_load(load)
    assert_history(result)
    assert result["figures"]["acked"] > 50, result
    return result


def test_leader_kill9_restarted_after_the_units_RestartSec(deployed: Deployment) -> None:
    """DEPLOY.md's unit: ``Restart=on-failure``, ``RestartSec``: SIGKILL is a failure, so the
    leader's process comes back after RestartSec. While it is down another replica is elected
    in a higher term than the one the killed leader held; it rejoins as that leader's follower."""
    t0 = time.monotonic()
    unit = deployed.broker_unit
    assert unit.restart == "on-failure" and unit.restart_sec > 0
    names = ["n1", "n2", "n3"]
    seen: dict[str, object] = {}

    def kill_and_restart() -> None:
        old = deployed.leader(names)
        status = deployed.status(old)
        assert status is not None and status["role"] == "leader", status
        term = int(status["term"])
        killed_at = time.monotonic()
        deployed.services[old].kill()
        others = [n for n in names if n != old]

        def elected() -> tuple[str, int] | None:
            assert not deployed.services[old].alive
            for name in others:
                s = deployed.status(name)
                if s and s["role"] == "leader" and int(s["term"]) > term:
                    return name, int(s["term"])
            return None
        new, new_term = wait_until(elected, 30, 0.1, f"a leader other than {old} in a term above {term}")
        seen["elected_s"] = time.monotonic() - killed_at
        # the unit starts it RestartSec after the kill (later if the election took longer: the
        # test must see it elected while the killed leader is down)
        time.sleep(max(0.0, unit.restart_sec - (time.monotonic() - killed_at)))
        deployed.start(old)

        def rejoined() -> bool:
            s = deployed.status(old)
            return bool(s and s["role"] == "follower" and s["leader"] == new and int(s["term"]) >= new_term)
        wait_until(rejoined, 60, 0.3, f"{old} back as {new}'s follower")
        seen.update(old=old, term=term, new=new, new_term=new_term)

    result = _under_load(deployed, "kill9", kill_and_restart)
    _verify(deployed)
    record("kill9", f"killed leader {seen['old']} (term {seen['term']}); {seen['new']} elected in term "
                    f"{seen['new_term']} {seen['elected_s']:.1f}s after the kill; {result['figures']}, "
                    f"{result['send_errors']} send errors; {time.monotonic() - t0:.1f}s")


def test_replace_a_failed_host_as_documented(deployed: Deployment) -> None:
    """DEPLOY.md "Replace a failed host": its disk gone, the host installed again with the
    same config and an empty /var/lib/raftmq, started WITHOUT ``raftmq replica init``: it is a
    new storage (``j-...``) that neither votes nor stands (its log at start, and ``voter:
    false`` with a ``vote_refusal`` naming it in ``/status`` when seen before it is recorded),
    the leader logs the lines the docs quote as it feeds and records it, and it ends a voter."""
    t0 = time.monotonic()
    leader = deployed.leader(["n1", "n2", "n3"])
    victim = next(n for n in ("n2", "n3", "n1") if n != leader)
    seen: dict[str, object] = {}
    marks = {n: deployed.log_mark(n) for n in ("n1", "n2", "n3") if n != victim}

    def replace() -> None:
        deployed.services[victim].kill()
        deployed.wipe(victim)
        deployed.start(victim)

        def recorded() -> bool:
            status = deployed.status(victim)
            if status is None or not str(status["storage"]).startswith("j-"):
                return False
            seen.setdefault("first", status)
            return bool(status["voter"])
        last = wait_until(recorded, 60, 0.1, f"{victim}'s new storage recorded (voter: true)")
        seen["last"] = last

    result = _under_load(deployed, "replace", replace)
    _verify(deployed)
    final = deployed.status(victim)
    assert final is not None and final["voter"] and final["vote_refusal"] is None, final
    token = str(final["storage"])
    assert token.startswith("j-"), final
    first = seen["first"]
    assert isinstance(first, dict) and first["storage"] == token, (first, token)
    if not first["voter"]:  # seen before it was recorded: the refusal names its new storage
        assert token in str(first["vote_refusal"]), first
    # its own log: a new storage that neither votes nor stands, then recorded
    own = deployed.services[victim].log_tail(100_000)
    at_start = own.find(f"{victim} neither votes nor stands: its storage {token} ")
    votes = own.find(f"storage {token} is the one the group recorded for {victim}: it votes and may stand")
    assert f"it starts as a new storage ({token}) of an existing group" in own, own[-3000:]
    assert 0 <= at_start < votes, own[-3000:]
    # the leader's log, the lines DEPLOY.md quotes (whichever replica led meanwhile)
    leaders_log = "\n".join(deployed.log_since(m) for m in marks.values())
    for line in (f"member {victim} answers with storage {token}, not the one recorded for it",
                 f"member {victim} (storage {token}) holds index",
                 "the commit index when it arrived: recording its storage"):
        assert line in leaders_log, (line, leaders_log[-3000:])
    recorded_line = rf"storages recorded \(committed\): [^\n]*\b{victim}={re.escape(token)}\b"
    assert re.search(recorded_line, leaders_log), leaders_log[-3000:]
    record("replace", f"replaced {victim} (storage {token}; first seen voter={first['voter']}, "
                      f"refusal {first['vote_refusal']!r}): {result['figures']}; "
                      f"{time.monotonic() - t0:.1f}s")


def test_rolling_restart_followers_then_the_leader(deployed: Deployment) -> None:
    """DEPLOY.md "Rolling restart": each follower restarted (``systemctl restart
    raftmq-broker``: SIGTERM, start) and caught up as ``raftmq cluster status --namesrv NS``
    shows it (role back, ``applied`` at least the others' ``commit``, health ``ok``), then
    the leader, which hands its role over first."""
    t0 = time.monotonic()
    names = ("n1", "n2", "n3")
    waits: list[str] = []

    def roll() -> None:
        rows = deployed.cluster_status()
        leaders = [n for n in names if rows[n]["role"] == "leader"]
        assert len(leaders) == 1, rows
        for name in [n for n in names if n != leaders[0]] + leaders:
            assert deployed.stop(name) == 0, deployed.services[name].log_tail()
            deployed.start(name)
            t = time.monotonic()
            rows = wait_until(lambda name=name: _caught_up(deployed.cluster_status(), name, names), 60, 0.5,
                              f"raftmq cluster status showing {name} caught up after its restart")
            waits.append(f"{name} {time.monotonic() - t:.1f}s")
        assert sum(rows[n]["role"] == "leader" for n in names) == 1, rows
        assert rows[leaders[0]]["role"] == "follower", rows  # the old leader handed over

    result = _under_load(deployed, "rolling", roll)
    _verify(deployed)
    record("rolling", f"rolling restart (caught up after: {', '.join(waits)}): {result['figures']}, "
                      f"{result['send_errors']} send errors; {time.monotonic() - t0:.1f}s")


def _caught_up(rows: dict[str, dict[str, str]], name: str,
               names: tuple[str, ...]) -> dict[str, dict[str, str]] | None:
    """``rows`` (``raftmq cluster status``) when they show ``name`` caught up as the docs say."""
    mine = rows.get(name)
    others = [rows[n] for n in names if n != name and n in rows and rows[n]["role"] != "DOWN"]
    if mine is None or mine["role"] not in ("follower", "leader") or mine["health"] != "ok" or not others:
        return None
    return rows if int(mine["applied"]) >= min(int(r["commit"]) for r in others) else None


def test_grow_three_to_five_and_shrink_back_to_three(deployed: Deployment) -> None:
    """DEPLOY.md "Grow a group" then "Shrink a group": n4 and n5 installed with ``peers``
    listing the current members and themselves and ``join = true``, each added with
    ``raftmq replica add``; then ``raftmq replica remove n5``, ``n4`` and their processes stopped."""
    t0 = time.monotonic()
    subnet = deployed.net.subnet
    ns = f"{subnet}.21:9876"
    members = ["n1", "n2", "n3"]

    def grow_and_shrink() -> None:
        for name in ("n4", "n5"):
            text = deployed.broker_toml(name, source="broker-n3.toml")
            peers = ", ".join(f'{m} = "{subnet}.{BROKERS[m]}:20911"' for m in [*members, name])
            text = re.sub(r"peers = \{[^}]*\}", f"peers = {{ {peers} }}", text)
            text = text.replace("secret_file =", "join = true\nsecret_file =", 1)
            deployed.install_broker(name, toml=text)
            deployed.start(name)
            wait_until(lambda name=name: deployed.status(name), 30, 0.3, f"{name} serving (a learner)")
            ip = deployed.net.hosts[name].ip
            deployed.cli("replica", "add", name, "--raft", f"{ip}:20911", "--client", f"{ip}:10911",
                         "--namesrv", ns, timeout=180)
            members.append(name)
        listed = deployed.cli("replica", "list", "--namesrv", ns).stdout
        assert all(m in listed for m in members), listed
        check_listeners(deployed)  # five replicas up: n4's and n5's ports refuse strangers too
        for name in ("n5", "n4"):
            deployed.cli("replica", "remove", name, "--namesrv", ns, timeout=180)
            deployed.stop(name)
            members.remove(name)
        listed = deployed.cli("replica", "list", "--namesrv", ns).stdout
        assert "n4" not in listed and "n5" not in listed, listed

    result = _under_load(deployed, "grow", grow_and_shrink)
    _verify(deployed)
    check_listeners(deployed)
    record("grow", f"grow 3 -> 5 -> 3 (probed at 5): {result['figures']}, {result['send_errors']} send "
                   f"errors; {time.monotonic() - t0:.1f}s")


def test_console_signed_in_shows_the_group_and_prometheus_scrapes_the_brokers_over_tls(
        deployed: Deployment) -> None:
    """DEPLOY.md "Monitoring": ``raftmq console --namesrv 10.0.0.21:9876`` on the operator's
    (client) host, signed in as the super user over HTTP, shows group g1's replicas and the
    consumer group ``billing``; a Prometheus run there with ``deploy/prometheus/prometheus.yml``
    (its addresses and CA path the host's, the scrape interval 1 s) has every broker target up
    over https."""
    t0 = time.monotonic()
    subnet = deployed.net.subnet
    client = deployed.client
    console = client.start("console", [RAFTMQ, "console", "--namesrv", f"{subnet}.21:9876"],
                           env=deployed.client_env())
    shown = deployed.python("console_check.py", "http://127.0.0.1:8080",
                            str(client.path("/root/.raftmq-admin")))
    assert shown["before"] is None and shown["user"] == "admin", shown
    text = json.dumps(shown["cluster"])
    assert "g1" in text and all(f"{subnet}.{BROKERS[n]}:10911" in text or f'"{n}"' in text
                                for n in ("n1", "n2", "n3")), text
    assert "billing" in {row["group"] for row in shown["groups"]}, shown["groups"]
    console.stop()
    console_s = time.monotonic() - t0

    prom = shutil.which("prometheus")
    assert prom, "prometheus is missing: run scripts/bootstrap --test-tools (apt-get install prometheus)"
    conf_dir = client.path("/etc/prometheus")
    conf_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(DEPLOY / "prometheus" / "raftmq-rules.yml", conf_dir / "raftmq-rules.yml")
    shutil.copy(client.path("/etc/raftmq/tls/ca.pem"), conf_dir / "raftmq-ca.pem")
    conf = client.localize((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (conf_dir / "prometheus.yml").write_text(conf.replace("scrape_interval: 15s", "scrape_interval: 1s"))
    client.start("prometheus", [prom, f"--config.file={conf_dir / 'prometheus.yml'}",
                                f"--storage.tsdb.path={client.path('/var/lib/prometheus')}",
                                "--web.listen-address=127.0.0.1:9090"])

    def targets_up() -> list[dict[str, object]] | None:
        done = client.run(["curl", "-s", "http://127.0.0.1:9090/api/v1/targets"], timeout=10)
        active = json.loads(done.stdout)["data"]["activeTargets"] if done.stdout else []
        return active if len(active) == 3 and all(t["health"] == "up" for t in active) else None
    active = wait_until(targets_up, 40, 0.5, "Prometheus: the three broker targets up")
    assert {str(t["scrapeUrl"]) for t in active} == {f"https://{subnet}.{BROKERS[n]}:10911/metrics"
                                                     for n in ("n1", "n2", "n3")}, active
    check_listeners(deployed)
    record("console", f"console signed in {console_s:.1f}s; Prometheus 3/3 up over https; "
                      f"{time.monotonic() - t0:.1f}s")
