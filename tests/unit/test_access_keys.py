"""RocketMQ access keys without a broker: the secret key sealed with the cluster secret
(broker/security/access_key_seal.py), the log records (broker/store/access_key_commands.py),
the replicated table and its canonical form (broker/state/access_keys.py, held by
AccessTables), and the signature check over them (broker/security/access_keys.py)."""

from __future__ import annotations

import msgpack
import pytest

from broker.security.access_key_seal import AccessKeySeal, SealError
from broker.security.access_keys import AccessKeyRefused, AccessKeys
from broker.state.access import AccessTables
from broker.state.snapshot import Snapshot
from broker.store.access_key_commands import PutAccessKey, RevokeAccessKey
from broker.store.commands import DeleteUser, PutUser, decode_admin, encode_admin
from protocol.access_keys import new_access_key, new_secret_key
from protocol.rocketmq import signature
from protocol.rocketmq.signature import SignedRequest

SECRET = "cluster-secret-of-g1-0123456789abcdef"
AK = "RMQ0123456789ABCDEF0123"
SK = "s3cr3t-Key_of-alice-0123456789abcdefghijk"


def _alice() -> PutUser:
    return PutUser("alice", False, b"s" * 16, 4096, b"k" * 32, b"v" * 32)


def _tables(*records: object) -> AccessTables:
    tables = AccessTables()
    for r in records:
        assert tables.apply(decode_admin(encode_admin(r))) is None  # type: ignore[arg-type]
    return tables


def _signed(ext: dict[str, str], body: bytes, access_key: str = AK, secret_key: str = SK) -> dict[str, str]:
    ext = {**ext, signature.ACCESS_KEY: access_key}
    return {**ext, signature.SIGNATURE: signature.sign(signature.signed_content(ext, body), secret_key)}


# -- sealing ----------------------------------------------------------------------------
def test_a_sealed_secret_unseals_on_every_replica_of_the_group_and_never_shows_it() -> None:
    sealed = AccessKeySeal(SECRET, "g1").seal(AK, "alice", SK)
    assert SK.encode() not in sealed
    assert AccessKeySeal(SECRET, "g1").unseal(AK, "alice", sealed) == SK  # another replica: same secret
    assert AccessKeySeal(SECRET, "g1").seal(AK, "alice", SK) != sealed  # a fresh nonce each time


@pytest.mark.parametrize(("secret", "group"), [("another-secret-0123456789abcdef", "g1"), (SECRET, "g2")])
def test_a_wrong_cluster_secret_or_group_cannot_unseal(secret: str, group: str) -> None:
    sealed = AccessKeySeal(SECRET, "g1").seal(AK, "alice", SK)
    with pytest.raises(SealError, match="does not unseal"):
        AccessKeySeal(secret, group).unseal(AK, "alice", sealed)


def test_a_tampered_or_moved_sealed_secret_is_refused() -> None:
    seal = AccessKeySeal(SECRET, "g1")
    sealed = seal.seal(AK, "alice", SK)
    for i in (0, 5, len(sealed) - 1):
        flipped = bytearray(sealed)
        flipped[i] ^= 0x01
        with pytest.raises(SealError):
            seal.unseal(AK, "alice", bytes(flipped))
    with pytest.raises(SealError):  # the same bytes moved to another user's record
        seal.unseal(AK, "mallory", sealed)
    with pytest.raises(SealError):  # or to another access key
        seal.unseal("RMQ-other-key", "alice", sealed)
    with pytest.raises(SealError):
        seal.unseal(AK, "alice", sealed[:20])


def test_a_group_without_a_cluster_secret_cannot_seal() -> None:
    seal = AccessKeySeal(None, "g1")
    assert not seal.usable
    with pytest.raises(SealError, match="no cluster secret"):
        seal.seal(AK, "alice", SK)


def test_new_keys_are_valid_and_distinct() -> None:
    keys = {new_access_key() for _ in range(100)}
    secrets = {new_secret_key() for _ in range(100)}
    assert len(keys) == len(secrets) == 100
    checker = AccessKeys(SECRET, "g1", AccessTables)
    for ak, sk in zip(sorted(keys)[:3], sorted(secrets)[:3], strict=True):
        checker.record(ak, "alice", sk, 0)  # no ValueError


# -- records and the table ----------------------------------------------------------------
def test_records_round_trip_and_the_table_keeps_keys_of_existing_users() -> None:
    sealed = AccessKeySeal(SECRET, "g1").seal(AK, "alice", SK)
    put, revoke = PutAccessKey(AK, "alice", sealed, 1_700_000_000_000), RevokeAccessKey(AK)
    assert decode_admin(encode_admin(put)) == put and decode_admin(encode_admin(revoke)) == revoke
    tables = AccessTables()
    assert tables.apply(put) == "no user 'alice': add it first"
    tables = _tables(_alice(), put)
    row = tables.access_keys.get(AK)
    assert row is not None and (row.user, row.sealed, row.created_ms) == ("alice", sealed, 1_700_000_000_000)
    resealed = AccessKeySeal(SECRET, "g1").seal(AK, "alice", "another-secret-key-123")
    other = PutAccessKey(AK, "alice", resealed, 5)
    assert tables.apply(other) == f"access key {AK!r} exists already"  # never replaced
    assert tables.access_keys.get(AK) == row
    version = tables.version
    assert tables.apply(revoke) is None and tables.access_keys.get(AK) is None and tables.version != version
    assert tables.apply(revoke) == f"no access key {AK!r}"


def test_deleting_a_user_revokes_its_keys_and_a_user_made_again_gets_none_back() -> None:
    sealed = AccessKeySeal(SECRET, "g1").seal(AK, "alice", SK)
    tables = _tables(_alice(), PutAccessKey(AK, "alice", sealed, 1), DeleteUser("alice"), _alice())
    assert tables.access_keys.get(AK) is None and len(tables.access_keys) == 0


def test_the_canonical_state_holds_keys_sealed_and_loads_back_the_same() -> None:
    assert "access_keys" not in AccessTables().state()  # no keys: the form (and digest) of before
    sealed = AccessKeySeal(SECRET, "g1").seal(AK, "alice", SK)
    tables = _tables(_alice(), PutAccessKey(AK, "alice", sealed, 7))
    state = tables.state()
    assert state["access_keys"] == {AK: ["alice", sealed, 7]}
    assert SK.encode() not in msgpack.packb(state, use_bin_type=True)
    again = AccessTables(state["users"], state.get("policies"), state["access_keys"])
    assert again.state() == state
    assert Snapshot.of(3, {"x": 1, **again.state()}).digest == Snapshot.of(3, {"x": 1, **state}).digest


# -- the signature check ------------------------------------------------------------------------
def test_a_request_signed_with_the_keys_secret_is_its_users() -> None:
    checker = AccessKeys(SECRET, "g1", lambda: tables)
    tables = _tables(_alice(), checker.record(AK, "alice", SK, 1))
    ext, body = {"topic": "orders", "queueId": "1"}, b"payload"
    assert checker.user_of(SignedRequest(_signed(ext, body), body)) == "alice"
    assert checker.user_of(SignedRequest(_signed(ext, body), body)) == "alice"  # cached: the same answer


@pytest.mark.parametrize(("case", "remark"), [
    ("unsigned", "sign requests with an access key"),
    ("unknown key", "is unknown or revoked"),
    ("wrong secret", "does not match"),
    ("changed body", "does not match"),
    ("changed field", "does not match"),
])
def test_a_request_not_signed_with_a_held_keys_secret_is_refused(case: str, remark: str) -> None:
    checker = AccessKeys(SECRET, "g1", lambda: tables)
    tables = _tables(_alice(), checker.record(AK, "alice", SK, 1))
    ext, body = {"topic": "orders"}, b"payload"
    sent_ext, sent_body = {
        "unsigned": (ext, body),
        "unknown key": (_signed(ext, body, access_key="RMQ-nobody"), body),
        "wrong secret": (_signed(ext, body, secret_key="not-the-secret-key-0123"), body),
        "changed body": (_signed(ext, body), b"payload!"),
        "changed field": ({**_signed(ext, body), "topic": "audit"}, body),
    }[case]
    with pytest.raises(AccessKeyRefused, match=remark) as refused:
        checker.user_of(SignedRequest(sent_ext, sent_body))
    assert SK not in str(refused.value)


def test_a_revoked_key_is_refused_although_its_secret_was_cached() -> None:
    checker = AccessKeys(SECRET, "g1", lambda: tables)
    tables = _tables(_alice(), checker.record(AK, "alice", SK, 1))
    body = b"x"
    assert checker.user_of(SignedRequest(_signed({}, body), body)) == "alice"
    assert tables.apply(RevokeAccessKey(AK)) is None
    with pytest.raises(AccessKeyRefused, match="unknown or revoked"):
        checker.user_of(SignedRequest(_signed({}, body), body))


def test_a_record_sealed_under_another_secret_is_refused_not_trusted() -> None:
    tables = _tables(_alice(), AccessKeys("another-secret-0123456789abcdef", "g1", AccessTables)
                     .record(AK, "alice", SK, 1))
    checker = AccessKeys(SECRET, "g1", lambda: tables)
    with pytest.raises(AccessKeyRefused, match="does not unseal"):
        checker.user_of(SignedRequest(_signed({}, b""), b""))
