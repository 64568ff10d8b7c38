"""Proof that a registration with the name server comes from a replica of its group.

A group's *registration key* is derived from its Raft cluster secret with HKDF-SHA256
under a fixed label and the group's name::

    key = HKDF-SHA256(ikm = secret, salt = none, info = "raftmq-namesrv-registration-v1|" + group)

A broker derives it from its own secret; the name server is given only the key (a file
of 64 hex digits written by ``raftmq namesrv-key``), never the secret. The key is one
way: it does not give the secret, nor the Raft port's keys (PBKDF2 of the secret,
``dledger.raft.peer_crypto``). Each group has its own key.

A registration ``POST /register`` carries four headers; the signature covers the
method, the path, the group, the timestamp, the nonce and the body's bytes::

    X-RaftMQ-Group: g1
    X-RaftMQ-Timestamp: 1718000000123            (ms since the epoch, the sender's clock)
    X-RaftMQ-Nonce: 32 hex digits                 (random per request)
    X-RaftMQ-Signature: 64 hex digits             HMAC-SHA256(key, signed text)

    signed text = "raftmq-register-v1\\nPOST\\n/register\\n" + group + "\\n" + timestamp
                  + "\\n" + nonce + "\\n" + body

The name server refuses (``AuthError``) an unknown group, a missing or bad signature, a
timestamp more than ``skew_s`` (60 s) from its own clock, and a nonce it has seen within
that window. Nonces are remembered per group only after the signature checks (a stranger
cannot fill the memory), at most ``max_nonces`` per group: when full, the oldest is
forgotten and every timestamp up to it is refused from then on, so a replay of a
forgotten nonce is still refused.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = ["AuthError", "RegistrationVerifier", "read_key_file", "registration_key", "sign_registration"]

LABEL = b"raftmq-namesrv-registration-v1|"
PATH = "/register"
H_GROUP, H_TS, H_NONCE, H_SIG = ("X-RaftMQ-Group", "X-RaftMQ-Timestamp", "X-RaftMQ-Nonce",
                                 "X-RaftMQ-Signature")
SKEW_S = 60.0
MAX_NONCES = 65_536


class AuthError(Exception):
    """A registration refused before its content is read: ``status`` 401, ``reason`` a
    short tag for rate-limited logging, the message says what is wrong."""

    def __init__(self, reason: str, message: str, status: int = 401) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


def registration_key(secret: str | bytes, group: str) -> bytes:
    """The 32-byte registration key of ``group`` whose Raft cluster secret is ``secret``."""
    raw = secret.encode() if isinstance(secret, str) else secret
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=LABEL + group.encode()).derive(raw)


def read_key_file(path: Path) -> bytes:
    """A key file's 32 bytes (64 hex digits, surrounding whitespace ignored); ValueError
    saying what is wrong otherwise. OSError when it cannot be read."""
    text = path.read_text().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{path} does not hold a key as 64 hex digits") from None
    if len(key) != 32:
        raise ValueError(f"{path} holds {len(key)} bytes, a key has 32 (64 hex digits)")
    return key


def _signed_text(group: str, ts: str, nonce: str, body: bytes) -> bytes:
    return f"raftmq-register-v1\nPOST\n{PATH}\n{group}\n{ts}\n{nonce}\n".encode() + body


def sign_registration(key: bytes, group: str, body: bytes, now_ms: int | None = None,
                      nonce: str | None = None) -> dict[str, str]:
    """The headers that authenticate ``body`` as a registration of ``group``."""
    ts = str(int(time.time() * 1000) if now_ms is None else now_ms)
    nonce = nonce or os.urandom(16).hex()
    sig = hmac.new(key, _signed_text(group, ts, nonce, body), hashlib.sha256).hexdigest()
    return {H_GROUP: group, H_TS: ts, H_NONCE: nonce, H_SIG: sig}


class _Nonces:
    """One group's nonces seen within the window, oldest first, bounded."""

    def __init__(self, limit: int) -> None:
        self._seen: OrderedDict[str, int] = OrderedDict()
        self._limit = limit
        self.floor_ms = 0  # timestamps at or below it are refused (their nonces were forgotten)

    def add(self, nonce: str, ts_ms: int, oldest_ms: int) -> bool:
        """Remember ``nonce``; False if it was seen (a replay). Forgets nonces older than
        ``oldest_ms`` (their timestamps are refused anyway)."""
        while self._seen and next(iter(self._seen.values())) < oldest_ms:
            self._seen.popitem(last=False)
        if nonce in self._seen:
            return False
        if len(self._seen) >= self._limit:
            _, forgotten = self._seen.popitem(last=False)
            self.floor_ms = max(self.floor_ms, forgotten)
        self._seen[nonce] = ts_ms
        return True

    def __len__(self) -> int:
        return len(self._seen)


class RegistrationVerifier:
    """Checks registrations against the groups' keys. Call from one thread (the name
    server's event loop)."""

    def __init__(self, keys: Mapping[str, bytes], skew_s: float = SKEW_S, max_nonces: int = MAX_NONCES,
                 clock: Callable[[], float] = time.time) -> None:
        self._keys = dict(keys)
        self._skew_ms = int(skew_s * 1000)
        self._clock = clock
        self._nonces = {g: _Nonces(max_nonces) for g in self._keys}

    @property
    def groups(self) -> list[str]:
        return sorted(self._keys)

    def nonces_held(self, group: str) -> int:
        return len(self._nonces[group])

    def verify(self, headers: Mapping[str, str], body: bytes) -> str:
        """The group ``body`` is authenticated for; raises AuthError otherwise."""
        group, ts, nonce, sig = (headers.get(h, "") for h in (H_GROUP, H_TS, H_NONCE, H_SIG))
        if not (group and ts and nonce and sig):
            raise AuthError("unsigned", f"a registration must be signed with its group's key: headers "
                            f"{H_GROUP}, {H_TS}, {H_NONCE}, {H_SIG}")
        key = self._keys.get(group)
        if key is None:
            raise AuthError("unknown group", f"group {group!r} is not served by this name server")
        if not (ts.isascii() and ts.isdigit()) or len(nonce) > 64:
            raise AuthError("malformed", "the timestamp must be ms since the epoch, the nonce at most 64 "
                            "characters")
        expected = hmac.new(key, _signed_text(group, ts, nonce, body), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected.encode(), sig.lower().encode("utf-8", "surrogateescape")):
            raise AuthError("bad signature", f"the signature does not match group {group!r}'s key")
        now = int(self._clock() * 1000)
        ts_ms = int(ts)
        if abs(now - ts_ms) > self._skew_ms:
            raise AuthError("stale", f"timestamp {ts_ms} is {abs(now - ts_ms) / 1000:.0f} s from this "
                            f"name server's clock (at most {self._skew_ms / 1000:.0f} s): check NTP")
        nonces = self._nonces[group]
        if ts_ms <= nonces.floor_ms or not nonces.add(nonce, ts_ms, now - self._skew_ms):
            raise AuthError("replayed", "this registration was seen before (a replay)")
        return group
