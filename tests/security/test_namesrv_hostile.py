"""The name server against hostile clients, on a local cluster (``raftmq cluster up``): replayed
and forged registrations, stale timestamps, stale leader claims, strangers, floods and
oversized bodies. After each, the route still names the real leader and members."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.security.registration_auth import registration_key, sign_registration
from tests.security.namesrv_cluster import Cluster, http_json, local_cluster, raftmq

pytestmark = [pytest.mark.cluster]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with local_cluster(tmp_path_factory.mktemp("hostile") / "c") as c:
        made = raftmq("topic", "create", "orders", "--queues", "2", "--dir", str(c.root))
        assert made.returncode == 0, made.stderr
        yield c


def key_of(c: Cluster) -> bytes:
    """What a holder of g1's registration key (a replica) can sign with."""
    return registration_key((c.root / "g1" / "secret").read_text().strip(), "g1")


def leader_status(c: Cluster) -> dict[str, Any]:
    _, address = c.leader()
    return dict(http_json(f"http://{address}/status")[1])


def body(node: str, role: str, term: int, address: str, members: list[str]) -> bytes:
    return json.dumps({"group": "g1", "node": node, "role": role, "term": term, "address": address,
                       "members": members, "topics": {"kind": "delta", "base": "x", "version": "y"}}).encode()


def post(c: Cluster, data: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    return http_json(f"http://{c.ns}/register", data=data, headers=headers)


def assert_route_intact(c: Cluster) -> None:
    _, leader = c.leader()
    code, route = http_json(f"http://{c.ns}/route/orders")
    assert code == 200, route
    (g,) = route["groups"]
    assert g["leader"] == leader and set(g["replicas"]) == {"n1", "n2", "n3"}, g


def test_a_replayed_registration_is_refused(cluster: Cluster) -> None:
    s = leader_status(cluster)
    follower = next(n for n in ("n1", "n2", "n3") if n != s["node"])
    data = body(follower, "follower", s["term"], cluster.nodes()[follower]["address"], ["n1", "n2", "n3"])
    headers = sign_registration(key_of(cluster), "g1", data)
    first = post(cluster, data, headers)
    assert first[0] in (200, 409), first  # accepted (409: its topics base is unknown, the identity holds)
    code, answer = post(cluster, data, headers)
    assert code == 401 and answer["reason"] == "replayed", answer
    assert_route_intact(cluster)


def test_forged_leader_claims_are_refused(cluster: Cluster) -> None:
    forged = body("evil", "leader", 99_999, "127.0.0.1:1", ["evil"])
    guessed = registration_key("a guess", "g1")
    for headers, reason in ((sign_registration(guessed, "g1", forged), "bad signature"),
                            (sign_registration(key_of(cluster), "g2", forged), "unknown group"),
                            ({}, "unsigned")):
        code, answer = post(cluster, forged, headers)
        assert code == 401 and answer["reason"] == reason, answer
    code, answer = post(cluster, forged, sign_registration(key_of(cluster), "g1", forged,
                                                           now_ms=int(time.time() * 1000) - 300_000))
    assert code == 401 and answer["reason"] == "stale", answer
    assert_route_intact(cluster)


def test_a_key_holder_cannot_claim_an_old_term_or_join_as_a_stranger(cluster: Cluster) -> None:
    s = leader_status(cluster)
    deposed = next(n for n in ("n1", "n2", "n3") if n != s["node"])
    stale = body(deposed, "leader", s["term"] - 1, "127.0.0.1:1", ["n1", "n2", "n3"])
    code, answer = post(cluster, stale, sign_registration(key_of(cluster), "g1", stale))
    assert code == 403 and answer["reason"] == "stale term", answer
    same = body(deposed, "leader", s["term"], "127.0.0.1:1", ["n1", "n2", "n3"])
    code, answer = post(cluster, same, sign_registration(key_of(cluster), "g1", same))
    assert code == 403 and answer["reason"] == "second leader", answer
    stranger = body("n9", "follower", s["term"], "127.0.0.1:1", ["n1", "n2", "n3", "n9"])
    code, answer = post(cluster, stranger, sign_registration(key_of(cluster), "g1", stranger))
    assert code == 403 and answer["reason"] == "not a member", answer
    assert_route_intact(cluster)


def test_floods_and_oversized_bodies_are_refused_and_logged_once_a_minute(cluster: Cluster) -> None:
    log_path: Path = cluster.root / "namesrv.log"
    junk = body("x", "leader", 1, "127.0.0.1:1", ["x"])
    for _ in range(200):
        assert post(cluster, junk, {"X-RaftMQ-Group": "g1", "X-RaftMQ-Timestamp": "1",
                                    "X-RaftMQ-Nonce": "00", "X-RaftMQ-Signature": "00"})[0] == 401
    assert log_path.read_text().count("(401 bad signature)") <= 1
    code, _ = post(cluster, b"[" * (4 << 20), {})
    assert code == 413
    assert_route_intact(cluster)


def test_a_non_ascii_signature_or_timestamp_is_refused_as_bad_not_500(cluster: Cluster) -> None:
    """Issue 25, row 9: a signature of non-ASCII characters made hmac.compare_digest raise
    (500 Internal Server Error); a timestamp of non-ASCII digits passed isdigit()."""
    s = leader_status(cluster)
    data = body(s["node"], "leader", s["term"], cluster.nodes()[s["node"]]["address"], ["n1", "n2", "n3"])
    headers = sign_registration(key_of(cluster), "g1", data)
    sig_header = next(h for h in headers if h.lower().endswith("signature"))
    ts_header = next(h for h in headers if h.lower().endswith("timestamp"))
    code, answer = post(cluster, data, {**headers, sig_header: "\u00e9" * 64})
    assert code == 401 and answer["reason"] == "bad signature", (code, answer)
    code, answer = post(cluster, data, {**headers, ts_header: "\u00b2" * 13})
    assert code == 401 and answer["reason"] == "malformed", (code, answer)
    assert_route_intact(cluster)


def test_a_web_page_can_neither_register_nor_read_routes_through_a_rebound_name(cluster: Cluster) -> None:
    """Issue 25, row 4 (second pass, G6): the name server's browser guard. A registration a
    page of another origin carries -- even one signed with the group's key -- is refused
    (403) before its signature is looked at (its nonce is not spent), and a page on a DNS
    name rebound to 127.0.0.1 cannot read a route (403)."""
    s = leader_status(cluster)
    data = body(s["node"], "leader", s["term"], cluster.nodes()[s["node"]]["address"], ["n1", "n2", "n3"])
    headers = sign_registration(key_of(cluster), "g1", data)
    code, answer = post(cluster, data, {**headers, "Origin": "http://evil.example"})
    assert code == 403 and "http://evil.example" in answer["error"], (code, answer)
    port = cluster.ns.rsplit(":", 1)[1]
    code, answer = http_json(f"http://{cluster.ns}/route/orders", headers={"Host": f"rebound.example:{port}"})
    assert code == 403 and "rebound.example" in answer["error"], (code, answer)
    code, answer = post(cluster, data, headers)  # the same registration from a tool: its nonce unspent
    assert code in (200, 409), (code, answer)
    assert_route_intact(cluster)
