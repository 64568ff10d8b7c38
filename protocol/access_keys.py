"""RocketMQ access keys on RaftMQ's own wire (issue 27): how a super user gives a user an
access key (AK) and secret key (SK) for RocketMQ clients signing with ``AclClientRPCHook``
(``protocol.rocketmq.signature``). The client makes the pair (``new_access_key``,
``new_secret_key``), so one pair serves every group; each group's leader seals the secret
with its own cluster secret before it enters the log::

    PUT_ACCESS_KEY (78)     ext  accessKey str (6..64 of letters, digits, '_', '-'),
                                 user str, secretKey str (16..128 printable ASCII, no space)
        response: a WriteResponse (protocol.send)
    REVOKE_ACCESS_KEY (79)  ext  accessKey str
        response: a WriteResponse
    LIST_ACCESS_KEYS (80)   ext  user str (optional: everyone's)
        response            body msgpack array of [accessKey, user, createdMs] rows (never a
                                 secret)

The secret key crosses the wire once, in PUT_ACCESS_KEY, on the super user's authenticated
connection (inside TLS when the port serves it).
"""

from __future__ import annotations

import re
import secrets
from typing import Annotated

import msgspec

from protocol.remoting import RequestCode
from protocol.wire import Request, Response

__all__ = ["AccessKeyRow", "AccessKeysResponse", "ListAccessKeysRequest", "PutAccessKeyRequest",
           "RevokeAccessKeyRequest", "check_access_key", "check_secret_key", "new_access_key",
           "new_secret_key"]

_ACCESS_KEY = re.compile(r"[A-Za-z0-9_-]{6,64}")
_SECRET_KEY = re.compile(r"[\x21-\x7e]{16,128}")
_NAME = Annotated[str, msgspec.Meta(min_length=1, max_length=255)]


def new_access_key() -> str:
    """A fresh access key: "RMQ" and 20 upper-case hex digits."""
    return "RMQ" + secrets.token_hex(10).upper()


def new_secret_key() -> str:
    """A fresh secret key: 32 random bytes as 43 URL-safe base64 characters."""
    return secrets.token_urlsafe(32)


def check_access_key(text: str) -> str:
    """``text`` if it is a valid access key; ValueError saying what one is otherwise."""
    if not _ACCESS_KEY.fullmatch(text):
        raise ValueError(f"access key {text[:70]!r} must be 6 to 64 of: letters, digits, '_', '-'")
    return text


def check_secret_key(text: str) -> str:
    """``text`` if it is a valid secret key (never echoed in the error)."""
    if not _SECRET_KEY.fullmatch(text):
        raise ValueError("a secret key is 16 to 128 printable ASCII characters without spaces")
    return text


class PutAccessKeyRequest(Request, frozen=True):
    CODE = RequestCode.PUT_ACCESS_KEY

    access_key: _NAME
    user: _NAME
    secret_key: _NAME

    def __repr__(self) -> str:  # never the secret in a log line or a traceback
        return f"PutAccessKeyRequest(access_key={self.access_key!r}, user={self.user!r}, secret_key=...)"


class RevokeAccessKeyRequest(Request, frozen=True):
    CODE = RequestCode.REVOKE_ACCESS_KEY

    access_key: _NAME


class ListAccessKeysRequest(Request, frozen=True):
    CODE = RequestCode.LIST_ACCESS_KEYS

    user: str | None = None


class AccessKeyRow(msgspec.Struct, array_like=True, frozen=True):
    access_key: str
    user: str
    created_ms: int


class AccessKeysResponse(Response, frozen=True):
    BODY = "access_keys"

    access_keys: tuple[AccessKeyRow, ...]
