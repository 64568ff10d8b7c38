"""Users, access policies and authentication on the wire (issue 15, build item 2).

Vocabulary (RocketMQ ACL 2.0's, shared by the CLI, the client and the broker)::

    resource   "cluster"                        the group itself (its users, offsets of
                                                everyone, admin reads, leadership)
               "topic:NAME"  "group:NAME"       one topic or consumer/producer group, exactly
               "topic:PREFIX*" "group:PREFIX*"  every name starting with PREFIX
               "topic:*"  "group:*"             every name
    action     pub sub create update delete get list
    decision   allow | deny                     a matching deny wins over any allow
    source     "" (anywhere) or a CIDR ("10.0.0.0/8", "::1/128"): where the request comes from

Authentication is SCRAM-SHA-256 (RFC 7677) in the first frames of a connection; the
password never crosses the wire and the broker holds only salt, iteration count,
StoredKey and ServerKey::

    AUTH_START (70)     ext  mechanism str ("SCRAM-SHA-256"), message str (client-first)
        response        ext  message str (server-first: nonce, salt, iterations)
    AUTH_FINISH (71)    ext  message str (client-final, with the proof)
        response        ext  message str (server-final: the server's signature), user str
    (AUTH_FAILED: wrong user or password, a replayed exchange, no exchange started)

User and policy management (super users only; a user may change their own password)::

    PUT_USER (72)       ext  user str, super bool, salt bin, iterations int >= 4096,
                             storedKey bin (32), serverKey bin (32)
    DELETE_USER (73)    ext  user str                   (their policies go with them)
        response: a WriteResponse (protocol.send)
    LIST_USERS (74)     no ext
        response        body msgpack array of [user, super] rows
    GRANT (75)          ext  user str, resource str, actions [str], decision str, source str
    REVOKE (76)         same ext; actions [] revokes the whole statement
        response: a WriteResponse
    LIST_POLICIES (77)  ext  user str (optional: everyone's)
        response        body msgpack array of PolicyRows
"""

from __future__ import annotations

import enum
import ipaddress
from typing import Annotated

import msgspec

from protocol.remoting import RequestCode
from protocol.wire import Request, Response

__all__ = ["DEFAULT_ITERATIONS", "MECHANISM", "MIN_ITERATIONS", "Action", "AuthFinishRequest", "AuthResponse",
           "AuthStartRequest", "Decision", "DeleteUserRequest", "GrantRequest",
           "ListPoliciesRequest", "ListUsersRequest", "PoliciesResponse", "PolicyRow", "PutUserRequest",
           "Resource", "ResourceType", "RevokeRequest", "UserRow", "UsersResponse", "parse_resource",
           "parse_source"]

MECHANISM = "SCRAM-SHA-256"
#: RFC 7677's minimum (and scramp's default) PBKDF2 iteration count.
MIN_ITERATIONS = 4096
#: The PBKDF2 iteration count of new records (OWASP Password Storage Cheat Sheet, 2023, for
#: PBKDF2-HMAC-SHA256; RFC 7677 asks at least 4,096). Stored records keep their own count.
DEFAULT_ITERATIONS = 600_000
_KEY = Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]
_NAME = Annotated[str, msgspec.Meta(min_length=1, max_length=255)]


class Action(enum.StrEnum):
    PUB = "pub"
    SUB = "sub"
    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"
    GET = "get"
    LIST = "list"


class ResourceType(enum.StrEnum):
    CLUSTER = "cluster"
    TOPIC = "topic"
    GROUP = "group"


class Decision(enum.StrEnum):
    ALLOW = "allow"
    DENY = "deny"


class Resource(msgspec.Struct, frozen=True):
    """A resource pattern: ``kind`` and ``name`` ("" for the cluster); ``prefix`` when the
    name is a prefix ("topic:ord*"), ``name`` "*" alone matches every name."""

    kind: ResourceType
    name: str = ""
    prefix: bool = False

    def matches(self, kind: ResourceType, name: str) -> bool:
        if kind != self.kind:
            return False
        if self.kind == ResourceType.CLUSTER or self.name == "*":
            return True
        return name.startswith(self.name) if self.prefix else name == self.name

    def __str__(self) -> str:
        if self.kind == ResourceType.CLUSTER:
            return "cluster"
        return f"{self.kind}:{self.name}{'*' if self.prefix else ''}"


def parse_resource(text: str) -> Resource:
    """``"topic:orders"``, ``"group:bill*"``, ``"topic:*"``, ``"cluster"`` -> Resource;
    ValueError saying what is allowed otherwise."""
    kind, _, name = text.partition(":")
    if kind == ResourceType.CLUSTER and name in ("", "*"):
        return Resource(ResourceType.CLUSTER)
    if kind not in (ResourceType.TOPIC, ResourceType.GROUP) or not name:
        raise ValueError(f"resource {text!r} is not cluster, topic:NAME, topic:PREFIX*, topic:*, "
                         "group:NAME, group:PREFIX* or group:*")
    if name == "*":
        return Resource(ResourceType(kind), "*")
    if "*" in name[:-1]:
        raise ValueError(f"resource {text!r}: '*' may only end a name (a prefix) or stand alone")
    if name.endswith("*"):
        return Resource(ResourceType(kind), name[:-1], prefix=True)
    return Resource(ResourceType(kind), name)


def parse_source(text: str) -> str:
    """A policy's source network in canonical form ("" for anywhere); ValueError if it is
    not a CIDR or an address."""
    if not text:
        return ""
    try:
        return str(ipaddress.ip_network(text, strict=False))
    except ValueError:
        raise ValueError(f"source {text!r} is not a network like 10.0.0.0/8 or an address") from None


class AuthStartRequest(Request, frozen=True):
    CODE = RequestCode.AUTH_START

    mechanism: str
    message: str


class AuthFinishRequest(Request, frozen=True):
    CODE = RequestCode.AUTH_FINISH

    message: str


class AuthResponse(Response, frozen=True):
    message: str
    user: str | None = None


class PutUserRequest(Request, frozen=True):
    CODE = RequestCode.PUT_USER

    user: _NAME
    super: bool
    salt: Annotated[bytes, msgspec.Meta(min_length=8, max_length=64)]
    iterations: Annotated[int, msgspec.Meta(ge=MIN_ITERATIONS, le=10_000_000)]
    stored_key: _KEY
    server_key: _KEY


class DeleteUserRequest(Request, frozen=True):
    CODE = RequestCode.DELETE_USER

    user: _NAME


class ListUsersRequest(Request, frozen=True):
    CODE = RequestCode.LIST_USERS


class UserRow(msgspec.Struct, array_like=True, frozen=True):
    user: str
    super: bool


class UsersResponse(Response, frozen=True):
    BODY = "users"

    users: tuple[UserRow, ...]


class GrantRequest(Request, frozen=True):
    CODE = RequestCode.GRANT

    user: _NAME
    resource: str
    actions: tuple[Action, ...]
    decision: Decision = Decision.ALLOW
    source: str = ""


class RevokeRequest(GrantRequest, frozen=True):
    CODE = RequestCode.REVOKE


class ListPoliciesRequest(Request, frozen=True):
    CODE = RequestCode.LIST_POLICIES

    user: str | None = None


class PolicyRow(msgspec.Struct, array_like=True, frozen=True):
    """One statement: ``user`` may (allow) or may not (deny) do ``actions`` on ``resource``
    from ``source``."""

    user: str
    resource: str
    decision: str
    source: str
    actions: tuple[str, ...]


class PoliciesResponse(Response, frozen=True):
    BODY = "policies"

    policies: tuple[PolicyRow, ...]
