"""Authenticated encryption of Raft peer traffic with AES-256-GCM.

pysyncobj encrypts every peer message with the object ``getEncryptor(password)``
returns (a Fernet by default: AES-CBC + HMAC + base64, which measured as the
largest single CPU cost of replication). ``install_peer_crypto`` points that
module-level name at ``PeerCipher``, which offers the same three methods over
AES-GCM with no base64. pysyncobj's own handshake (random per-connection keys,
monotonic timestamps) is kept on top.

Token layout (big-endian)::

    ┌─────────┬───────────────┬────────────────────┬───────────────┬──────────────────────┐
    │ ver (1) │ timestamp (8) │ sender salt (16)   │ counter (8)   │ ciphertext + tag (16) │
    └─────────┴───────────────┴────────────────────┴───────────────┴──────────────────────┘

The cluster secret is stretched once with PBKDF2-SHA256 into a master key. Each
process picks a random 16-byte salt and encrypts under
``HKDF(master, info=salt)`` with a counter nonce, so nonces never repeat under
one key (no birthday bound across restarts). The first 33 bytes are the
associated data, so a tampered timestamp or salt fails authentication. A peer
with another secret derives other keys: every message it sends fails to
authenticate and pysyncobj drops the connection.
"""

from __future__ import annotations

import itertools
import os
import struct
import threading

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

__all__ = ["InvalidToken", "PeerCipher", "install_peer_crypto"]

VERSION = 1
HEADER = struct.Struct(">BQ16sQ")
assert HEADER.size == 33
_PBKDF2_SALT = b"raftmq-peer-secret-v1"
_PBKDF2_ROUNDS = 200_000


class InvalidToken(Exception):
    """A message that does not authenticate under this cluster secret."""


def _subkey(master: bytes, salt: bytes) -> AESGCM:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=salt).derive(master)
    return AESGCM(key)


class PeerCipher:
    """pysyncobj's encryptor interface (encrypt_at_time / extract_timestamp / decrypt)."""

    def __init__(self, secret: str | bytes) -> None:
        raw = secret.encode() if isinstance(secret, str) else secret
        self._master = PBKDF2HMAC(algorithm=hashes.SHA256(), length=32, salt=_PBKDF2_SALT,
                                  iterations=_PBKDF2_ROUNDS).derive(raw)
        self._salt = os.urandom(16)
        self._own = _subkey(self._master, self._salt)
        self._counter = itertools.count(1)
        self._peers: dict[bytes, AESGCM] = {}
        self._lock = threading.Lock()

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        with self._lock:
            counter = next(self._counter)
        header = HEADER.pack(VERSION, current_time, self._salt, counter)
        nonce = b"\0\0\0\0" + header[25:33]
        return header + self._own.encrypt(nonce, data, header)

    def extract_timestamp(self, token: bytes) -> int:
        if len(token) < HEADER.size + 16 or token[0] != VERSION:
            raise InvalidToken("not a RaftMQ peer message")
        return HEADER.unpack_from(token)[1]

    def decrypt(self, token: bytes) -> bytes:
        if len(token) < HEADER.size + 16 or token[0] != VERSION:
            raise InvalidToken("not a RaftMQ peer message")
        header = token[:HEADER.size]
        salt = header[9:25]
        cipher = self._own if salt == self._salt else self._peer_cipher(salt)
        try:
            return cipher.decrypt(b"\0\0\0\0" + header[25:33], token[HEADER.size:], header)
        except InvalidTag:
            raise InvalidToken("message does not authenticate (wrong cluster secret?)") from None

    def _peer_cipher(self, salt: bytes) -> AESGCM:
        cipher = self._peers.get(salt)
        if cipher is None:
            cipher = _subkey(self._master, salt)
            with self._lock:
                if len(self._peers) > 1024:  # peers restarted many times: forget old salts
                    self._peers.clear()
                self._peers[salt] = cipher
        return cipher


_installed = False


def install_peer_crypto() -> None:
    """Make pysyncobj build a ``PeerCipher`` from ``conf.password``. Idempotent."""
    global _installed
    if _installed:
        return
    from pysyncobj import syncobj

    syncobj.getEncryptor = PeerCipher
    _installed = True
