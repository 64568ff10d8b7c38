"""``Status``: one replica's log as ``Log.status()`` reports it -- role, term, indexes, members,
storage identity, disk -- typed, so a caller reads ``status.term``, not ``status["term"]``.
``to_json()`` is the same object as JSON values (dicts, lists, strings and numbers), in this
field order: the ``/status`` documents of a broker and a log node are it plus their own keys.

The ``disk``, ``snapshot_fetch`` and ``storages_catching_up`` values are the JSON objects of
their owners (``DiskGuard.status``, the snapshot fetch's progress, the storage binding),
passed through as they are.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["MemberStatus", "Status"]


class MemberStatus(msgspec.Struct, frozen=True):
    """One member's addresses and recorded storage token ("" while none is)."""

    raft: str
    client: str
    storage: str


class Status(msgspec.Struct, frozen=True, kw_only=True):
    group: str
    node: str
    role: str  #: ``Role``'s value: follower, candidate, leader
    term: int
    leader: str | None
    commit_index: int
    raft_commit_index: int
    first_index: int
    last_index: int
    write_position: int
    #: a leader's match index per follower ({} on a follower)
    follower_match_index: dict[str, int]
    peers_connected: dict[str, bool]
    last_fsync_time: float | None
    flush: str
    conflict_truncations: int
    lease_hand_offs: int
    followers_behind_retained_start: list[str]
    #: (first, last) index ranges a reset log never received
    log_resets: list[tuple[int, int]]
    members: dict[str, MemberStatus]
    #: this replica's storage token, whether it may vote and why not
    storage: str
    voter: bool
    vote_refusal: str | None
    storages_catching_up: dict[str, dict[str, Any]]
    #: why this replica may have forgotten what it acknowledged (None: it did not)
    forgot: str | None
    member: bool
    members_changed_at: int
    pre_vote_rounds: int
    pre_vote_won: int
    snapshot_fetch: dict[str, Any] | None
    disk: dict[str, Any]
    disk_full_members: list[str]

    def to_json(self) -> dict[str, Any]:
        """The status as the JSON object it is sent as (a new dict the caller may extend):
        structs become objects, tuples lists."""
        out: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(self))
        return out
