"""Issue 25, row 7: password guessing is delayed and capped.

Before: a connection whose AUTH_FINISH failed could send AUTH_START again and guess on, as
fast as it liked, and so could ``POST /auth/scram`` (the console's sign-in goes through it);
nothing counted failures per user or per source; new SCRAM records had 4,096 iterations;
and an unknown user's fake salt was keyed per process, so two replicas answered the same
unknown name with different salts (a real user's salt is the same everywhere).

Now an exchange that failed ends the connection's attempts; failures are counted per user
and per source address (``protocol.login_throttle``): past a few free ones each further
attempt must wait a doubling delay and past a cap it is refused for the window, with an
audit line and ``raftmq_auth_failures_total``/``raftmq_auth_throttled_total``; new records
have 600,000 iterations; fake salts come from the group secret. Three broker processes with
ACLs on, stopped by PID.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Iterator

import aiohttp
import pytest

from broker.security.access_control import MAX_HTTP_EXCHANGES_PER_SOURCE
from client import Admin, Credentials
from client.credentials import scram_record
from protocol.acl import DEFAULT_ITERATIONS
from protocol.login_throttle import SOURCE_FREE, USER_FREE
from protocol.remoting import RequestCode, ResponseCode
from raftmq.local_group import LocalGroup
from tests.security.acl_cluster import ROOT, acl_brokers, leader_address, run
from tests.support.broker_client import FrameClient, client_session
from tests.support.broker_group import servers

pytestmark = [pytest.mark.cluster]

ALICE = Credentials("alice", "alice-password")
CAROL = Credentials("carol", "carol-password")


@pytest.fixture  # a group per test: failures counted per source (127.0.0.1) must not carry over
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGroup]:
    with acl_brokers(tmp_path_factory.mktemp("guess") / "g") as g:
        admin = Admin(servers=servers(g), credentials=ROOT)
        try:
            for who in (ALICE, CAROL):
                admin.put_user(who.user, who.password)
        finally:
            admin.close()
        yield g


async def _logins(address: str, attempts: list[tuple[str, str]]) -> list[tuple[int, str]]:
    """Each (user, password) on its own new connection: (code, remark) of the last answer."""
    out = []
    async with client_session(None) as session:
        for user, password in attempts:
            conn = await FrameClient.connect(session, address)
            try:
                _, _, answer = await conn.login(user, password)
                out.append((answer.code, answer.remark or ""))
            finally:
                await conn.close()
    return out


async def _http_login(address: str, user: str) -> tuple[int, str]:
    """The first step of ``POST /auth/scram``: (status, the error or "")."""
    import scramp
    client = scramp.ScramClient(["SCRAM-SHA-256"], user, "whatever")
    async with aiohttp.ClientSession() as session, session.post(
            f"http://{address}/auth/scram", json={"message": client.get_client_first()}) as resp:
        return resp.status, (await resp.json()).get("error", "")


def test_a_failed_exchange_ends_the_connections_attempts(group: LocalGroup) -> None:
    async def go() -> tuple[tuple[int, str], tuple[int, str]]:
        async with client_session(None) as session:
            conn = await FrameClient.connect(session, leader_address(group))
            try:
                _, _, wrong = await conn.login(CAROL.user, "not-her-password")
                _, _, again = await conn.login(CAROL.user, CAROL.password)
                return (wrong.code, wrong.remark or ""), (again.code, again.remark or "")
            finally:
                await conn.close()
    wrong, again = run(go())
    assert wrong[0] == ResponseCode.AUTH_FAILED
    assert again[0] == ResponseCode.AUTH_FAILED, "a second AUTH_START after a failed one was served"
    assert "new connection" in again[1], again[1]


def test_guesses_at_one_user_are_delayed_then_refused(group: LocalGroup) -> None:
    address = leader_address(group)
    answers = run(_logins(address, [(ALICE.user, f"guess-{i}") for i in range(USER_FREE)]))
    assert all(code == ResponseCode.AUTH_FAILED for code, _ in answers), answers
    ((code, remark),) = run(_logins(address, [(ALICE.user, ALICE.password)]))
    assert code == ResponseCode.AUTH_FAILED, "the right password was tried at once after the free guesses"
    assert "too many failed authentications" in remark and "alice" in remark, remark
    status, error = run(_http_login(address, ALICE.user))  # the console's sign-in goes this way
    assert status == 429 and "too many failed authentications" in error, (status, error)
    name = next(n for n, p in group.nodes.items() if p.http == address)
    log = (group.base / f"{name}.log").read_text()
    assert re.search(r"raftmq.audit.*throttled user=alice from=127\.0\.0\.1", log), group.log_tail(name)
    metrics = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    failures = re.search(r'^raftmq_auth_failures_total\{[^}]*\} (\S+)', metrics, re.M)
    throttled = re.search(r'^raftmq_auth_throttled_total\{[^}]*\} (\S+)', metrics, re.M)
    assert failures and float(failures.group(1)) >= USER_FREE, metrics[-2000:]
    assert throttled and float(throttled.group(1)) >= 2


def _metric(address: str, name: str) -> float:
    metrics = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    found = re.search(rf'^{name}(?:{{[^}}]*}})? (\S+)', metrics, re.M)
    return float(found.group(1)) if found else 0.0


def test_exchanges_started_in_parallel_have_at_most_the_free_allowance_checked(group: LocalGroup) -> None:
    """Second pass (G1): the throttle was asked only when an exchange started, so exchanges
    started together, before any failure was recorded, all had their proofs checked (~256
    connections per address past the 20-per-user cap). Now it is asked again right before a
    proof is checked: USER_FREE + 10 exchanges started, all finished wrong, have at most
    USER_FREE proofs checked; the rest are throttled."""
    import scramp
    address = leader_address(group)
    before = _metric(address, "raftmq_auth_failures_total")

    async def go() -> list[tuple[int, str]]:
        async with client_session(None) as session:
            conns = [await FrameClient.connect(session, address) for _ in range(USER_FREE + 10)]
            try:
                finals = []
                for conn in conns:  # every exchange started before any proof is checked
                    client = scramp.ScramClient(["SCRAM-SHA-256"], ALICE.user, "a-guess")
                    first = await conn.call(RequestCode.AUTH_START, {"mechanism": "SCRAM-SHA-256",
                                                                     "message": client.get_client_first()})
                    assert first.code == ResponseCode.SUCCESS, first.remark
                    client.set_server_first(str(first.ext["message"]))
                    finals.append(client.get_client_final())
                answers = await asyncio.gather(*(conn.call(RequestCode.AUTH_FINISH, {"message": final})
                                                 for conn, final in zip(conns, finals, strict=True)))
                return [(a.code, a.remark or "") for a in answers]
            finally:
                for conn in conns:
                    await conn.close()
    answers = run(go())
    assert all(code == ResponseCode.AUTH_FAILED for code, _ in answers), answers
    checked = _metric(address, "raftmq_auth_failures_total") - before
    assert checked <= USER_FREE, f"{checked:.0f} proofs of {len(answers)} parallel guesses were checked"
    throttled = [remark for _, remark in answers if "too many failed authentications" in remark]
    assert len(throttled) >= 10, answers


def test_http_exchanges_started_in_parallel_have_at_most_the_free_allowance_checked(
        group: LocalGroup) -> None:
    """Second pass (G1), ``POST /auth/scram``: as many exchanges as one source may hold
    pending (MAX_HTTP_EXCHANGES_PER_SOURCE > USER_FREE), all started before any second step,
    then all finished wrong: at most USER_FREE proofs checked (401), the rest 429."""
    import scramp
    address = leader_address(group)
    before = _metric(address, "raftmq_auth_failures_total")

    async def go() -> list[int]:
        async with aiohttp.ClientSession() as session:
            async def step(doc: dict[str, str]) -> tuple[int, dict[str, str]]:
                async with session.post(f"http://{address}/auth/scram", json=doc) as resp:
                    return resp.status, await resp.json()

            finals = []
            for _ in range(MAX_HTTP_EXCHANGES_PER_SOURCE):
                client = scramp.ScramClient(["SCRAM-SHA-256"], ALICE.user, "a-guess")
                status, first = await step({"message": client.get_client_first()})
                assert status == 200, first
                client.set_server_first(first["message"])
                finals.append({"session": first["session"], "message": client.get_client_final()})
            answers = await asyncio.gather(*(step(doc) for doc in finals))
            return [status for status, _ in answers]
    statuses = run(go())
    checked = _metric(address, "raftmq_auth_failures_total") - before
    assert checked <= USER_FREE, f"{checked:.0f} proofs of {len(statuses)} parallel guesses were checked"
    assert statuses.count(429) >= MAX_HTTP_EXCHANGES_PER_SOURCE - USER_FREE, statuses
    assert set(statuses) <= {401, 429}, statuses


def _server_first(address: str, user: str) -> str:
    async def go() -> str:
        async with client_session(None) as session:
            conn = await FrameClient.connect(session, address)
            try:
                import scramp
                client = scramp.ScramClient(["SCRAM-SHA-256"], user, "x")
                answer = await conn.call(RequestCode.AUTH_START, {"mechanism": "SCRAM-SHA-256",
                                                                  "message": client.get_client_first()})
                assert answer.code == ResponseCode.SUCCESS, answer.remark
                return str(answer.ext["message"])
            finally:
                await conn.close()
    return str(run(go()))


def test_unknown_users_get_the_same_salt_and_iterations_on_every_replica(group: LocalGroup) -> None:
    firsts = [_server_first(node.http, "nobody-here") for node in group.nodes.values()]
    shapes = [re.sub(r"^r=[^,]*,", "", first) for first in firsts]  # the nonce differs
    assert len(set(shapes)) == 1, shapes
    assert shapes[0].endswith(f",i={DEFAULT_ITERATIONS}"), shapes[0]
    assert DEFAULT_ITERATIONS >= 600_000 and scram_record("pw").iterations == DEFAULT_ITERATIONS


def test_one_source_holds_a_bounded_number_of_pending_http_exchanges(group: LocalGroup) -> None:
    """Issue 25, row 9: anyone could fill the 1,024 pending ``/auth/scram`` exchanges (each
    held 10 s), and then nobody could get an admin token."""
    address = leader_address(group)
    answers = [run(_http_login(address, f"pending-{i}")) for i in range(MAX_HTTP_EXCHANGES_PER_SOURCE + 1)]
    assert all(status == 200 for status, _ in answers[:-1]), answers
    status, error = answers[-1]
    assert status == 503 and "authentications pending from 127.0.0.1" in error, (status, error)


def test_guesses_from_one_source_are_delayed(group: LocalGroup) -> None:
    leader = leader_address(group)
    address = next(n.http for n in group.nodes.values() if n.http != leader)  # counters are per replica
    answers = run(_logins(address, [(f"nobody-{i}", "guess") for i in range(SOURCE_FREE)]))
    assert all(code == ResponseCode.AUTH_FAILED for code, _ in answers), answers
    ((code, remark),) = run(_logins(address, [(ROOT.user, ROOT.password)]))
    assert code == ResponseCode.AUTH_FAILED, "tried at once after the source's free guesses"
    assert "too many failed authentications from 127.0.0.1" in remark, remark
