"""Registration keys, signatures, replays, and the name server's config file."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from broker.namesrv.config import read_namesrv_config
from broker.namesrv.server import run_key
from broker.security.registration_auth import (
    AuthError,
    RegistrationVerifier,
    registration_key,
    sign_registration,
)
from common.toml_config import ConfigError
from dledger.raft.peer_crypto import PeerCipher


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


KEY = registration_key("s3cret", "g1")


def test_keys_are_per_group_and_secret_and_not_the_raft_keys() -> None:
    assert len(KEY) == 32 and registration_key("s3cret", "g1") == KEY
    assert registration_key("s3cret", "g2") != KEY and registration_key("other", "g1") != KEY
    assert KEY not in (PeerCipher("s3cret")._master,)  # the Raft port's master key differs


def verifier(clock: Clock, **options: float) -> RegistrationVerifier:
    return RegistrationVerifier({"g1": KEY}, clock=clock, **options)  # type: ignore[arg-type]


def refusal(v: RegistrationVerifier, headers: dict[str, str], body: bytes) -> str:
    with pytest.raises(AuthError) as e:
        v.verify(headers, body)
    assert e.value.status == 401
    return e.value.reason


def test_a_signed_registration_is_accepted_once() -> None:
    clock = Clock()
    v = verifier(clock)
    body = b'{"group": "g1"}'
    headers = sign_registration(KEY, "g1", body, now_ms=int(clock.now * 1000))
    assert v.verify(headers, body) == "g1"
    assert refusal(v, headers, body) == "replayed"
    assert refusal(v, headers, body + b" ") == "bad signature"  # the body is covered
    assert refusal(v, {**headers, "X-RaftMQ-Timestamp": str(int(clock.now * 1000) + 1)}, body) == \
        "bad signature"  # so is the timestamp
    assert refusal(v, sign_registration(registration_key("guess", "g1"), "g1", body), body) == "bad signature"
    assert refusal(v, sign_registration(KEY, "g9", body), body) == "unknown group"
    assert refusal(v, {}, body) == "unsigned"


def test_timestamps_outside_the_window_are_refused() -> None:
    clock = Clock()
    v = verifier(clock, skew_s=60)
    body = b"{}"
    now_ms = int(clock.now * 1000)
    assert refusal(v, sign_registration(KEY, "g1", body, now_ms=now_ms - 61_000), body) == "stale"
    assert refusal(v, sign_registration(KEY, "g1", body, now_ms=now_ms + 61_000), body) == "stale"
    assert v.verify(sign_registration(KEY, "g1", body, now_ms=now_ms - 59_000), body) == "g1"


def test_nonce_memory_is_bounded_and_a_forgotten_nonce_still_cannot_be_replayed() -> None:
    clock = Clock()
    v = verifier(clock, max_nonces=3)
    body = b"{}"
    sent = []
    for i in range(5):
        headers = sign_registration(KEY, "g1", body, now_ms=int(clock.now * 1000) + i)
        sent.append(headers)
        v.verify(headers, body)
    assert v.nonces_held("g1") == 3
    assert refusal(v, sent[0], body) == "replayed"  # forgotten, but at or below the floor
    assert refusal(v, sent[4], body) == "replayed"  # remembered
    clock.now += 120  # past the window: old nonces go; their timestamps are refused anyway
    v.verify(sign_registration(KEY, "g1", body, now_ms=int(clock.now * 1000)), body)
    assert v.nonces_held("g1") == 1


def test_config_is_strict_and_reads_the_key_files(tmp_path: Path) -> None:
    (tmp_path / "g1.key").write_text(KEY.hex() + "\n")
    path = tmp_path / "namesrv.toml"
    path.write_text('[namesrv]\nlisten = "0.0.0.0:9876"\n\n[groups.g1]\nkey_file = "g1.key"\n')
    config = read_namesrv_config(path)
    assert config.listen == "0.0.0.0:9876" and config.keys == {"g1": KEY} and config.clock_skew_s == 60
    path.write_text('[groups.g1]\nkey_file = "g1.key"\nsecret = "x"\n')
    with pytest.raises(ConfigError, match="no key 'secret'"):
        read_namesrv_config(path)
    path.write_text('[groups.g1]\nkey_file = "missing.key"\n')
    with pytest.raises(ConfigError, match=r"missing\.key"):
        read_namesrv_config(path)
    (tmp_path / "bad.key").write_text("not hex")
    path.write_text('[groups.g1]\nkey_file = "bad.key"\n')
    with pytest.raises(ConfigError, match="64 hex digits"):
        read_namesrv_config(path)


def test_the_key_command_derives_from_a_secret_file_or_a_replica_config(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "secret").write_text("s3cret\n")
    args = argparse.Namespace(config=None, group="g1", secret_file=tmp_path / "secret", out=None)
    assert run_key(args) == 0 and capsys.readouterr().out.strip() == KEY.hex()
    node = tmp_path / "n1.toml"
    node.write_text('[node]\nname = "n1"\n[group]\nname = "g1"\npeers = { n1 = "127.0.0.1:1" }\n'
                    'secret_file = "secret"\n[broker]\nlisten = "127.0.0.1:2"\n')
    out = tmp_path / "g1.key"
    assert run_key(argparse.Namespace(config=node, group=None, secret_file=None, out=out)) == 0
    assert out.read_text().strip() == KEY.hex() and out.stat().st_mode & 0o777 == 0o600
