"""PeerCipher: round trip, tamper detection, wrong secret, unique nonces."""

from __future__ import annotations

import pytest

from dledger.raft.peer_crypto import HEADER, InvalidToken, PeerCipher


@pytest.fixture(scope="module")
def pair() -> tuple[PeerCipher, PeerCipher]:
    return PeerCipher("s3cret"), PeerCipher("s3cret")


def test_round_trip_between_processes(pair: tuple[PeerCipher, PeerCipher]) -> None:
    a, b = pair
    token = a.encrypt_at_time(b"append_entries", 1234)
    assert b.extract_timestamp(token) == 1234
    assert b.decrypt(token) == b"append_entries"
    assert a.decrypt(token) == b"append_entries"


def test_tampering_is_detected(pair: tuple[PeerCipher, PeerCipher]) -> None:
    a, b = pair
    token = bytearray(a.encrypt_at_time(b"payload", 7))
    for pos in (3, HEADER.size + 2, len(token) - 1):  # timestamp, ciphertext, tag
        bad = bytearray(token)
        bad[pos] ^= 1
        with pytest.raises(InvalidToken):
            b.decrypt(bytes(bad))


def test_wrong_secret_fails() -> None:
    token = PeerCipher("one").encrypt_at_time(b"x", 1)
    with pytest.raises(InvalidToken, match="wrong cluster secret"):
        PeerCipher("two").decrypt(token)


def test_garbage_is_refused(pair: tuple[PeerCipher, PeerCipher]) -> None:
    with pytest.raises(InvalidToken):
        pair[0].extract_timestamp(b"gAAAAAB-a-fernet-token")


def test_nonces_never_repeat(pair: tuple[PeerCipher, PeerCipher]) -> None:
    a, _ = pair
    headers = {a.encrypt_at_time(b"", 1)[:HEADER.size] for _ in range(1000)}
    assert len(headers) == 1000
