"""ConsumerRegistry: who is a live member of which group, over which connection, as which user."""

from __future__ import annotations

import pytest

from broker.consumer_registry import NOT_A_MEMBER, ClientIdTaken, ConsumerRegistry


def test_a_client_id_is_its_users_while_it_lives() -> None:
    now = [0.0]
    r = ConsumerRegistry(clock=lambda: now[0], expiry_s=30)
    assert r.heartbeat("conn-a", "c1", {"g": ["t"], "h": ["t"]}, user="alice") == {"g", "h"}
    assert r.user_of("g", "c1") == "alice" and r.user_of("g", "c2") is NOT_A_MEMBER
    with pytest.raises(ClientIdTaken, match="'c1' of group 'h' is registered by another user"):
        r.heartbeat("conn-m", "c1", {"x": ["t"], "h": ["t"]}, user="mallory")
    assert r.clients("x") == [] and r.user_of("h", "c1") == "alice"  # nothing of it recorded
    assert r.heartbeat("conn-a2", "c1", {"g": ["t"]}, user="alice") == set()  # its own reconnect
    assert r.heartbeat("conn-m", "c2", {"g": ["t"]}, user="mallory") == {"g"}  # an id of its own
    now[0] += 31  # silent past the expiry: the id is free again
    assert r.user_of("g", "c1") is NOT_A_MEMBER
    assert r.heartbeat("conn-m", "c1", {"g": ["t"]}, user="mallory") == {"g", "h"}  # h: c1 expired


def test_without_acls_every_registration_is_nobodys_and_any_connection_may_renew_it() -> None:
    r = ConsumerRegistry()
    r.heartbeat("conn-1", "c1", {"g": ["t"]})
    assert r.heartbeat("conn-2", "c1", {"g": ["t"]}) == set() and r.user_of("g", "c1") is None
    assert r.unregister("c1", "g", "conn-1") == set()  # only over the connection it registered on
    assert r.unregister("c1", "g", "conn-2") == {"g"} and r.clients("g") == []
