"""Which members of a group cannot store entries, as a leader knows it, and what it answers.

A leader knows its own disk's flag (``dledger.storage.disk_guard``) and hears its followers':
every answer a follower gives to an append says whether its disk is full
(``dledger.raft.transport``). A proposal is refused -- ``DiskFull``, naming the full members,
definitely not committed -- when the leader's own disk is full (it is handing the
leadership over), or when the members with room are no majority: the entry could not
commit anyway, and the client learns why at once instead of after a timeout::

    members 3, full {n2, n3}:  1 with room  <= 3 / 2   refuse, naming n2, n3
    members 3, full {n3}:      2 with room  >  3 / 2   accept
    members 5, full {n4, n5}:  3 with room  >  5 / 2   accept

Threads: ``heard`` on pysyncobj's tick thread; the rest from any thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from typing import Any

from dledger.errors import DiskFull
from dledger.storage.disk_guard import DiskGuard

__all__ = ["FollowerDisks", "own_disk_full", "refusal"]

log = logging.getLogger("dledger.replicated_log")


class FollowerDisks:
    """What each follower's last answer said about its disk (on a leader)."""

    def __init__(self) -> None:
        self._full: dict[str, bool] = {}

    def heard(self, name: str, full: bool) -> None:
        if self._full.get(name, False) != full:
            log.log(logging.WARNING if full else logging.INFO, "follower %s says its disk is %s",
                    name, "full: it cannot store entries" if full else "no longer full")
        self._full[name] = full

    def is_full(self, name: str) -> bool:
        return self._full.get(name, False)

    def node_is_full(self, node: Any) -> bool:
        """Transport (tick thread): whether pysyncobj's ``node`` last said its disk is full."""
        return self.is_full(getattr(node, "name", ""))

    def note_answer(self, node: Any, message: dict[str, Any], names: Callable[[], dict[str, str]]) -> bool:
        """Transport intercept (tick thread): every answer of a follower to an append says
        whether its disk is full (``dledger.raft.transport``); ``names()``: Raft address -> member.
        Consumes nothing (returns False)."""
        if message.get("type") == "next_node_idx":
            name = getattr(node, "name", "") or names().get(getattr(node, "address", ""))
            if name:  # else a learner (read-only peer): it does not count for a majority
                self.heard(name, bool(message.get("disk_full")))
        return False

    def full_among(self, names: Iterable[str]) -> set[str]:
        return {n for n in names if self._full.get(n, False)}


def own_disk_full(node: str, group: str, disk: DiskGuard) -> DiskFull:
    """The answer of a replica whose own disk is full."""
    return DiskFull([node], f"replica {node} of group {group} cannot store entries: its disk is "
                    f"full ({disk.reason}); writes resume by themselves once "
                    f"{disk.resume_threshold()} bytes are free there")


def refusal(node: str, group: str, disk: DiskGuard, full: Collection[str],
            members: int) -> DiskFull | None:
    """Why a proposal to leader ``node`` cannot be stored now, or None (module docstring);
    ``full``: the members known to be full, ``members``: how many members there are."""
    if disk.full:
        return own_disk_full(node, group, disk)
    if full and 2 * (members - len(full)) <= members:
        names = ", ".join(sorted(full))
        return DiskFull(sorted(full), f"replicas {names} of group {group} cannot store entries: "
                        f"their disks are full, and without them no majority of the {members} "
                        "members can. Writes resume by themselves once space is freed there")
    return None
