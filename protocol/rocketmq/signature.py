"""RocketMQ's request signature (``AclClientRPCHook`` on the client, ``PlainAccessValidator``
on the broker, rocketmq-acl 4.9.7): what is signed and how, so a broker can check a
request came from the holder of an access key's secret.

A signed request carries, among its extFields::

    AccessKey      the access key (the account's name)
    Signature      Base64(HMAC-SHA1(secret key, content))
    SecurityToken  optional (STS); signed like any other field

    content = the values of every extField but Signature and _UNIQUE_KEY_QUERY, in the
              order of their keys (Java's TreeMap: by UTF-16 code units), concatenated,
              as UTF-8, followed by the body's bytes

Pure; ``verify`` compares in constant time. ``SignedRequest`` is what a broker checks: a
received frame's extFields and body, as they came.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from protocol.rocketmq.frame import RemotingFrame

__all__ = ["ACCESS_KEY", "SECURITY_TOKEN", "SIGNATURE", "SignedRequest", "access_key", "sign",
           "signed_content", "verify"]

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
_UNSIGNED = frozenset({SIGNATURE, "_UNIQUE_KEY_QUERY"})


def _utf16_key(key: str) -> bytes:
    return key.encode("utf-16-be")


def signed_content(ext: Mapping[str, str] | None, body: bytes) -> bytes:
    """The bytes a request's signature covers (module docstring)."""
    fields = ext or {}
    values = "".join(fields[k] for k in sorted(fields, key=_utf16_key) if k not in _UNSIGNED)
    return values.encode("utf-8") + body


def sign(content: bytes, secret_key: str) -> str:
    """``Base64(HMAC-SHA1(secret_key, content))``, as the client's hook writes it."""
    return base64.b64encode(hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()).decode()


def access_key(ext: Mapping[str, str] | None) -> str | None:
    """The access key a request names (None: an unsigned request)."""
    return (ext or {}).get(ACCESS_KEY)


def verify(ext: Mapping[str, str] | None, body: bytes, secret_key: str) -> bool:
    """Whether the request's Signature is the one ``secret_key`` makes of it."""
    given = (ext or {}).get(SIGNATURE)
    if not given:
        return False
    return hmac.compare_digest(given.encode(), sign(signed_content(ext, body), secret_key).encode())


@dataclass(frozen=True, slots=True)
class SignedRequest:
    """A request as its signature covers it: extFields and body, as received."""

    ext: Mapping[str, str] | None
    body: bytes

    @classmethod
    def of(cls, frame: RemotingFrame) -> SignedRequest:
        return cls(frame.ext, frame.body)

    @property
    def access_key(self) -> str | None:
        """The access key it names (None: unsigned)."""
        return access_key(self.ext)

    def signed_with(self, secret_key: str) -> bool:
        """Whether its Signature is the one ``secret_key`` makes of it."""
        return verify(self.ext, self.body, secret_key)
