"""Replicas check each other (etcd's corruption check): equal history, equal state.

Every replica records the digest of its derived state (``broker.state.snapshot``) at fixed
log indexes: before each CommitLog segment and every ``DIGEST_EVERY`` entries. Every
``CHECK_EVERY_S`` each replica fetches its peers' recent digests (``/status``) and
compares those at the indexes both hold::

    my digest at i == the majority's      fine
    a majority of the group (me excluded) agrees at i, and not with me
                                          I am divergent: /healthz answers 503, every
                                          request is refused (SYSTEM_BUSY: clients use
                                          another replica), I stop standing for
                                          election, an ERROR names the index, and
                                          raftmq_state_divergent is 1 -- until an
                                          operator resyncs me (docs/DEPLOY.md); the
                                          verdict is kept in ``DIVERGENT`` in the data
                                          directory, so a restart does not forget it
    no majority either way                an ERROR each time (a 3-node group with one
                                          replica down cannot tell who is wrong)

A leader also logs an ERROR for each follower whose digest differs from its own.
Divergence can only come from a defect or a damaged disk: the apply step is
deterministic and replicas apply the same committed entries.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from common.durable_file import atomic_write, read_or_none

__all__ = ["CHECK_EVERY_S", "MARKER", "DivergenceCheck", "Verdict", "judge"]

log = logging.getLogger("broker.divergence")

CHECK_EVERY_S = 10.0
MARKER = "DIVERGENT"  # in the data directory: this replica was found divergent, and why


@dataclass(frozen=True, slots=True)
class Verdict:
    divergent_at: int | None = None          # I differ from a majority at this index
    undecided_at: int | None = None          # digests differ, no majority either way
    followers_off: dict[str, int] = field(default_factory=dict)  # peer -> index it differs at


def judge(mine: Mapping[int, str], peers: Mapping[str, Mapping[int, str]], group_size: int) -> Verdict:
    """Compare my digests with my peers' at every index I hold that a peer holds too."""
    divergent = undecided = None
    off: dict[str, int] = {}
    for index in sorted(mine):
        theirs = {name: d[index] for name, d in peers.items() if index in d}
        if not theirs:
            continue
        for name, digest in theirs.items():
            if digest != mine[index]:
                off.setdefault(name, index)
        counts: dict[str, int] = {}
        for digest in theirs.values():
            counts[digest] = counts.get(digest, 0) + 1
        majority = group_size // 2 + 1
        if counts.get(mine[index], 0) + 1 >= majority or (len(counts) == 1 and mine[index] in counts):
            continue  # a majority (or everyone who answered) has my state
        if max(counts.values()) >= majority:  # a majority of the group, without me, agrees
            divergent = divergent if divergent is not None else index
        else:
            undecided = undecided if undecided is not None else index
    return Verdict(divergent, undecided, off)


class DivergenceCheck:
    """Runs ``judge`` against the peers every ``CHECK_EVERY_S`` (asyncio)."""

    def __init__(self, me: str, peers: Mapping[str, str] | Callable[[], Mapping[str, str]],
                 group_size: int | Callable[[], int],
                 mine: Callable[[], Mapping[int, str]],
                 fetch: Callable[[str], Awaitable[Mapping[int, str] | None]],
                 is_leader: Callable[[], bool],
                 on_divergent: Callable[[str], None], marker: Path | None = None) -> None:
        """``peers``: node -> address (or a function giving the current ones: members change);
        ``fetch(address)`` returns a peer's digests or None; ``marker``: the file that keeps
        the verdict across restarts (an earlier one is in force at once)."""
        self.me = me
        self._peers = peers if callable(peers) else (lambda fixed=dict(peers): fixed)
        self._group_size = group_size if callable(group_size) else (lambda fixed=group_size: fixed)
        self.mine, self.fetch, self.is_leader, self.on_divergent = mine, fetch, is_leader, on_divergent
        self.divergent: str | None = None
        self.last = Verdict()
        self.mismatches = 0
        self._marker = marker
        kept = read_or_none(marker) if marker is not None else None
        if kept is not None:
            self.divergent = kept.decode(errors="replace")
            log.error("%s (found before this start): it serves nothing and does not stand for "
                      "election", self.divergent)
            on_divergent(self.divergent)

    async def check_once(self) -> Verdict:
        addresses = self._peers()
        names = [n for n in addresses if n != self.me]
        answers = await asyncio.gather(*(self.fetch(addresses[n]) for n in names),
                                       return_exceptions=True)
        peers = {n: a for n, a in zip(names, answers, strict=True) if isinstance(a, Mapping)}
        verdict = judge(self.mine(), peers, self._group_size())
        self.last = verdict
        if verdict.followers_off:
            self.mismatches += 1
            if self.is_leader():
                for name, index in sorted(verdict.followers_off.items()):
                    log.error("replica %s's state digest differs from this leader's at index %d",
                              name, index)
        if verdict.divergent_at is not None and self.divergent is None:
            self.divergent = (f"this replica's state differs from its peers' at index "
                              f"{verdict.divergent_at}; resync it (docs/DEPLOY.md)")
            log.error("%s: it stops serving and standing for election", self.divergent)
            if self._marker is not None:
                try:
                    atomic_write(self._marker, self.divergent.encode())
                except OSError as e:
                    log.error("cannot keep the verdict in %s (a restart forgets it): %s", self._marker, e)
            self.on_divergent(self.divergent)
        elif verdict.undecided_at is not None:
            log.error("state digests differ at index %d and no majority agrees: cannot tell "
                      "which replica is wrong", verdict.undecided_at)
        return verdict

    async def run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            try:
                await self.check_once()
            except Exception:
                log.exception("divergence check failed")
