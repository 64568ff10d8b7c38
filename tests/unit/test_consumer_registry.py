"""ConsumerRegistry: who is a live member of which group, over which connection, as which user."""

from __future__ import annotations

import pytest

from broker.clients.registry import (
    MAX_MEMBERS_PER_CONNECTION,
    ClientIdTaken,
    ConsumerRegistry,
    TooManyMembers,
)


def test_a_client_id_is_its_users_while_it_lives() -> None:
    now = [0.0]
    r = ConsumerRegistry(clock=lambda: now[0], expiry_s=30)
    assert r.heartbeat("conn-a", "c1", {"g": ["t"], "h": ["t"]}, user="alice") == {"g", "h"}
    r.require_owner("g", "c1", "alice")
    r.require_owner("g", "c2", "mallory")  # not a member: anyone's
    with pytest.raises(ClientIdTaken):
        r.require_owner("g", "c1", "mallory")
    with pytest.raises(ClientIdTaken, match="'c1' of group 'h' is registered by another user"):
        r.heartbeat("conn-m", "c1", {"x": ["t"], "h": ["t"]}, user="mallory")
    assert r.clients("x") == []  # nothing of it recorded
    r.require_owner("h", "c1", "alice")
    assert r.heartbeat("conn-a2", "c1", {"g": ["t"]}, user="alice") == set()  # its own reconnect
    assert r.heartbeat("conn-m", "c2", {"g": ["t"]}, user="mallory") == {"g"}  # an id of its own
    now[0] += 31  # silent past the expiry: the id is free again
    r.require_owner("g", "c1", "mallory")
    assert r.heartbeat("conn-m", "c1", {"g": ["t"]}, user="mallory") == {"g", "h"}  # h: c1 expired


def test_without_acls_every_registration_is_nobodys_and_any_connection_may_renew_it() -> None:
    r = ConsumerRegistry()
    r.heartbeat("conn-1", "c1", {"g": ["t"]})
    assert r.heartbeat("conn-2", "c1", {"g": ["t"]}) == set()
    r.require_owner("g", "c1", None)
    assert r.unregister("c1", "g", "conn-1") == set()  # only over the connection it registered on
    assert r.unregister("c1", "g", "conn-2") == {"g"} and r.clients("g") == []


def test_a_heartbeat_does_not_scan_every_member() -> None:
    """Issue 25, row 6: expire() walked every member of every group at every heartbeat
    (20,000 members: 2,000 heartbeats took 1.7 s); now it looks only at the expired."""
    import time

    now = [0.0]
    r = ConsumerRegistry(clock=lambda: now[0], expiry_s=30)
    for i in range(20_000):
        r.heartbeat(f"conn-{i % 100}", f"c{i}", {f"g{i % 2_000}": ["t"]})
    started = time.perf_counter()
    for _ in range(2_000):
        r.heartbeat("conn-0", "c0", {"g0": ["t"]})
    assert time.perf_counter() - started < 0.5
    now[0] += 31
    assert r.heartbeat("conn-0", "c0", {"g0": ["t"]}) == {f"g{i}" for i in range(2_000)}
    assert r.clients("g0") == ["c0"] and r.clients("g1") == []


def test_a_connection_holds_a_bounded_number_of_memberships() -> None:
    r = ConsumerRegistry()
    for i in range(MAX_MEMBERS_PER_CONNECTION):
        r.heartbeat("conn", f"c{i}", {"g": ["t"]})
    r.heartbeat("conn", "c0", {"g": ["t"]})  # a renewal is no new membership
    with pytest.raises(TooManyMembers, match=f"at most {MAX_MEMBERS_PER_CONNECTION} memberships"):
        r.heartbeat("conn", "c-extra", {"g": ["t"]})
    r.drop_connection("conn")
    r.heartbeat("conn", "c-extra", {"g": ["t"]})
    assert r.clients("g") == ["c-extra"]
