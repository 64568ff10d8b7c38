"""Sealing a RocketMQ access key's secret key for the Raft log (issue 27, build item 5).

A RocketMQ client signs every request with its secret key (``AclClientRPCHook``;
``protocol.rocketmq.signature``), so a broker must hold the secret itself, not a hash of it.
The log -- and with it checkpoints, snapshots, state digests and every readonly Raft
connection -- holds it only sealed, under a key derived from the group's cluster secret::

    key    = HKDF-SHA256(cluster secret, salt = none,
                         info = "raftmq-rocketmq-access-key-v1|" + group name)
    sealed = | version 1 (1) | nonce (12, random) | AES-256-GCM(key, nonce, secret key, aad) |
    aad    = "raftmq-access-key-v1" 0x00 access key 0x00 user

The associated data binds the sealed bytes to their access key and user: a record whose
sealed secret was moved to another key or user, or changed in any byte, does not unseal.
Every replica of the group holds the same secret, so each unseals what the leader sealed;
a process with another secret (another group, a stolen log without the secret) cannot.

Pure; ``AccessKeySeal`` is immutable and may be shared between threads.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = ["LABEL", "AccessKeySeal", "SealError"]

LABEL = b"raftmq-rocketmq-access-key-v1|"
_VERSION = 1
_NONCE_BYTES = 12
_AAD_PREFIX = b"raftmq-access-key-v1\x00"


class SealError(ValueError):
    """Sealed bytes that do not unseal under this group's key (another secret, another access
    key or user, a changed byte), or a group without a secret to seal with."""


class AccessKeySeal:
    """Seals and unseals secret keys under ``group``'s cluster ``secret``."""

    def __init__(self, secret: str | bytes | None, group: str) -> None:
        raw = secret.encode() if isinstance(secret, str) else secret
        self._aead = None if not raw else AESGCM(
            HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=LABEL + group.encode()).derive(raw))

    @property
    def usable(self) -> bool:
        """False when the group has no cluster secret (``--insecure``): nothing can be sealed."""
        return self._aead is not None

    def seal(self, access_key: str, user: str, secret_key: str) -> bytes:
        """``secret_key`` sealed for the record of ``access_key`` and ``user`` (module docstring)."""
        aead = self._need()
        nonce = os.urandom(_NONCE_BYTES)
        return bytes([_VERSION]) + nonce + aead.encrypt(nonce, secret_key.encode(), _aad(access_key, user))

    def unseal(self, access_key: str, user: str, sealed: bytes) -> str:
        """The secret key sealed in ``sealed``; SealError if it does not unseal here."""
        aead = self._need()
        if len(sealed) < 1 + _NONCE_BYTES + 16 or sealed[0] != _VERSION:
            raise SealError(f"access key {access_key!r}: not a sealed secret of version {_VERSION}")
        nonce, box = sealed[1:1 + _NONCE_BYTES], sealed[1 + _NONCE_BYTES:]
        try:
            return aead.decrypt(nonce, box, _aad(access_key, user)).decode()
        except (InvalidTag, UnicodeDecodeError):
            raise SealError(f"access key {access_key!r}: its sealed secret does not unseal with this "
                            "group's cluster secret (another secret, or a changed record)") from None

    def _need(self) -> AESGCM:
        if self._aead is None:
            raise SealError("this group has no cluster secret: access keys cannot be sealed")
        return self._aead


def _aad(access_key: str, user: str) -> bytes:
    return _AAD_PREFIX + access_key.encode() + b"\x00" + user.encode()
