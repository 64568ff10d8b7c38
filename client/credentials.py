"""A user's credentials on the client side, and the SCRAM-SHA-256 record of a password.

``Credentials(user, password)`` is what producers, consumers and the admin take
(``credentials=``); the password stays in this process: brokers are sent a SCRAM proof
(``client.aio.auth``), never the password. The command line reads credentials from the
environment (``RAFTMQ_USER``, ``RAFTMQ_PASSWORD``) or from a file (``RAFTMQ_CREDENTIALS_FILE``
or ``--credentials-file``: two lines, user then password; keep it mode 0600) -- never
from argv, which other users of the host can read.

``scram_record(password)`` gives what a broker stores of a password: salt, iteration
count, StoredKey and ServerKey (``raftmq user add``, ``raftmq user hash``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import scramp
import scramp.core

from protocol.acl import DEFAULT_ITERATIONS, MECHANISM

# New records have 600,000 PBKDF2 iterations (~0.4 s here): a client reconnecting with the
# same password, salt and count derives its SaltedPassword once per process, not per login.
_hi = scramp.core.hi


@functools.lru_cache(maxsize=32)
def _cached_hi(hf: object, password: bytes, salt: bytes, iterations: int) -> bytes:
    return bytes(_hi(hf, password, salt, iterations))


def _salted_password(hf: object, password: bytes, salt: bytes, iterations: int) -> bytes:
    return _cached_hi(hf, password, salt, int(iterations))  # scramp passes an IterationCount


if getattr(_hi, "__name__", "") != "_salted_password":
    scramp.core.hi = _salted_password

__all__ = ["ENV_FILE", "ENV_PASSWORD", "ENV_USER", "Credentials", "ScramRecord", "scram_record"]

ENV_USER, ENV_PASSWORD, ENV_FILE = "RAFTMQ_USER", "RAFTMQ_PASSWORD", "RAFTMQ_CREDENTIALS_FILE"


@dataclass(frozen=True, slots=True)
class Credentials:
    user: str
    password: str

    def __repr__(self) -> str:  # never print the password
        return f"Credentials(user={self.user!r}, password=***)"

    @classmethod
    def from_file(cls, path: str | Path) -> Credentials:
        """Two lines: the user name, then the password; ValueError otherwise."""
        lines = Path(path).read_text().splitlines()
        if len(lines) < 2 or not lines[0].strip():
            raise ValueError(f"{path}: expected two lines, the user name then the password")
        return cls(lines[0].strip(), lines[1])

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, file: str | None = None) -> Credentials | None:
        """``file`` if given, else ``RAFTMQ_CREDENTIALS_FILE``, else ``RAFTMQ_USER`` and
        ``RAFTMQ_PASSWORD``; None when none is set (anonymous)."""
        env = os.environ if env is None else env
        path = file or env.get(ENV_FILE)
        if path:
            return cls.from_file(path)
        user, password = env.get(ENV_USER), env.get(ENV_PASSWORD)
        if not user:
            return None
        if password is None:
            raise ValueError(f"{ENV_USER} is set but {ENV_PASSWORD} is not")
        return cls(user, password)


@dataclass(frozen=True, slots=True)
class ScramRecord:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def scram_record(password: str, iterations: int = DEFAULT_ITERATIONS) -> ScramRecord:
    """What a broker stores of ``password``: a fresh random salt and the derived keys."""
    salt, stored_key, server_key, count = scramp.ScramMechanism(MECHANISM).make_auth_info(
        password, iteration_count=iterations)
    return ScramRecord(salt, count, stored_key, server_key)
