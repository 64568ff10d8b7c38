"""The storage rule on pysyncobj's messages, and a leader recording new storages.

``dledger.raft.storage_rule`` says who counts; this module makes pysyncobj (0.3.17, pinned) obey
it without touching its code, on the messages our transport sees first:

    every answer this replica sends        carries its storage token ("storage")
    request_vote to a replica that may     dropped: no vote, no term raised
      not vote
    response_vote from a storage that      dropped: the candidate does not count it
      does not count
    pre_vote (dledger.raft.election.prevote)             not granted by a replica that may not vote
    pre_vote_response                      a grant from a storage that does not count is
                                           read as a refusal
    next_node_idx on a leader, from a      its success is turned into a plain "resume at"
      storage that does not count          (pysyncobj then sets the follower's next index,
                                           not its match index: it is fed, never counted)

and a replica that may not vote does not stand (``candidacy.STORAGE_NOT_RECORDED``). A replica
about to drop entries it may have acknowledged while it runs (a snapshot install over a log
that was not behind, ``RaftJournal.clear``) takes a new joiner identity at once (``forget``).

A leader records a storage (one bind entry, ``dledger.membership``) when:

    * a member with no storage recorded answers as a founder, or the leader is one itself:
      recorded at once (it counted already; the record lets the group tell it from any
      later storage under that name);
    * a member answers with a storage that does not count: recorded once its log has
      reached the leader's commit index at the first such answer (it holds everything
      acknowledged before it arrived; what is acknowledged after, it receives as it goes).

Each step is logged at INFO. Threads: everything runs on pysyncobj's tick thread except
``status`` and ``refusal`` (reads of values swapped whole).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pysyncobj.config import FAIL_REASON

from common.refusal_log import Throttle
from dledger.membership import MemberHistory, encode_bindings
from dledger.raft.storage_identity import StorageIdentity, is_founder_token, write_identity
from dledger.raft.storage_rule import counts, self_vote_refusal

__all__ = ["STAMPED", "StorageBinding"]

log = logging.getLogger("dledger.replicated_log")

#: the answers that carry the sender's storage token
STAMPED = frozenset({"next_node_idx", "response_vote", "pre_vote_response"})
RETRY_S = 2.0  # a bind entry that failed is proposed again after this long
_DROP_LOG_S = 10.0


@dataclass(slots=True)
class _Arrival:
    """A storage that does not count yet, as a leader sees it."""

    token: str
    target: int  # the leader's commit index at its first answer
    match: int = 0  # the highest index it said it holds


class StorageBinding:
    """One replica's side of the storage rule (module docstring)."""

    def __init__(self, name: str, identity: StorageIdentity, history: MemberHistory, *,
                 committed_index: Callable[[], int], is_leader: Callable[[], bool],
                 names: Callable[[], dict[str, str]], propose: Callable[[bytes, Any], None],
                 stand: Callable[[bool], None], clock: Callable[[], float] = time.monotonic) -> None:
        """``names``: Raft address -> member name; ``propose(payload, callback)`` appends a
        bind entry (pysyncobj's callback ``(result, error)``); ``stand(allowed)`` lifts or
        holds ``candidacy.STORAGE_NOT_RECORDED``."""
        self._name = name
        self.identity = identity
        self._history = history
        self._committed = committed_index
        self._is_leader = is_leader
        self._names = names
        self._propose = propose
        self._stand = stand
        self._clock = clock
        self._names_for: object = None
        self._names_cache: dict[str, str] = {}
        self._arrivals: dict[str, _Arrival] = {}
        self._founders_seen: dict[str, str] = {}
        self._in_flight = False
        self._retry_at = 0.0
        self._refusal: str | None = self._self_refusal()
        self._drops = Throttle(_DROP_LOG_S, clock)

    @property
    def token(self) -> str:
        return self.identity.token

    # -- the rule ------------------------------------------------------------------------
    def _recorded_committed(self, name: str) -> bool:
        return self._history.storage_recorded_at(name) <= self._committed()

    def _self_refusal(self) -> str | None:
        return self_vote_refusal(self._history.current().get(self._name), self.token,
                                 self._recorded_committed(self._name))

    def refusal(self) -> str | None:
        """Why this replica may not vote or stand now (None: it may)."""
        return self._refusal

    def _name_of(self, node: Any) -> str | None:
        """The member name of a peer node (by Raft address), cached per member set: this
        runs for every answer a leader receives."""
        members = self._history.current()
        if self._names_for is not members:
            self._names_for, self._names_cache = members, self._names()
        return self._names_cache.get(getattr(node, "address", None) or "")

    def counts_answer(self, node: Any, message: dict[str, Any]) -> bool:
        name = self._name_of(node)
        if name is None:
            return False
        token = message.get("storage")  # None: a replica of a version before identities
        if token is not None and not isinstance(token, str):
            token = ""
        return counts(self._history.current().get(name), token, self._recorded_committed(name))

    def forget(self, data_dir: Path, why: str) -> StorageIdentity:
        """This replica is about to drop entries it may have acknowledged (``why``): a new
        joiner identity, written first; from now on it neither votes nor stands until the
        leader has recorded it. Tick thread."""
        self.identity = StorageIdentity.new(founder=False)
        write_identity(data_dir, self.identity)
        self._refusal = self._self_refusal()
        log.warning("this replica may have forgotten what it acknowledged (%s): it is now a new storage %s "
                    "and %s", why, self.token, "votes" if self._refusal is None else "neither votes nor "
                    "stands until it has caught up and the leader has recorded it")
        self._stand(self._refusal is None)
        return self.identity

    # -- messages --------------------------------------------------------------------------
    def stamp(self, message: Any) -> Any:
        """An outgoing message, with this replica's storage token on the answers."""
        if isinstance(message, dict) and message.get("type") in STAMPED:
            return {**message, "storage": self.token}
        return message

    def on_message(self, node: Any, message: dict[str, Any]) -> bool:
        """Transport intercept: True consumes ``message``; may rewrite it in place."""
        kind = message.get("type")
        if kind == "request_vote":
            if self._refusal is None:
                return False
            self._dropped("vote request", self._refusal)
            return True
        if kind == "response_vote":
            if self.counts_answer(node, message):
                return False
            self._dropped("vote", f"from a storage that does not count ({message.get('storage')})")
            return True
        if kind == "pre_vote_response":
            if message.get("granted") and not self.counts_answer(node, message):
                message["granted"] = False
            return False
        if kind == "next_node_idx" and self._is_leader():
            self._note_answer(node, message)
        return False

    def _dropped(self, what: str, why: str) -> None:
        if self._drops.take(what) is not None:
            log.info("ignored a %s: %s", what, why)

    def _note_answer(self, node: Any, message: dict[str, Any]) -> None:
        name = self._name_of(node)
        if name is None:
            return
        token = message.get("storage") if isinstance(message.get("storage"), str) else ""
        record = self._history.current().get(name)
        if self.counts_answer(node, message):
            self._arrivals.pop(name, None)
            if record is not None and not record.storage and is_founder_token(token):
                self._founders_seen[name] = token
            return
        matched = message["next_node_idx"] - 1 if message.get("success") else 0
        # fed, never counted: pysyncobj sets its next index, not its match index
        message["success"] = False
        message["reset"] = True
        arrival = self._arrivals.get(name)
        if arrival is None or arrival.token != token:
            arrival = _Arrival(token or "(none)", self._committed())
            self._arrivals[name] = arrival
            log.info("member %s answers with storage %s, not the one recorded for it (%s): it is fed the "
                     "log but not counted for commits or votes until it holds index %d, then recorded",
                     name, arrival.token, record.storage if record and record.storage else "none yet",
                     arrival.target)
        arrival.match = max(arrival.match, matched)

    # -- ticks -----------------------------------------------------------------------------
    def tick(self) -> None:
        refusal = self._self_refusal()
        if refusal != self._refusal:
            self._refusal = refusal
            if refusal is None:
                log.info("storage %s is the one the group recorded for %s: it votes and may stand",
                         self.token, self._name)
            else:
                log.warning("%s neither votes nor stands: %s", self._name, refusal)
            self._stand(refusal is None)
        if not self._is_leader():
            self._arrivals.clear()
            self._founders_seen.clear()
            return
        if self._in_flight or self._clock() < self._retry_at:
            return
        bindings = self._due()
        if bindings:
            self._in_flight = True
            log.info("recording storages %s", ", ".join(f"{n}={t}" for n, t in sorted(bindings.items())))
            self._propose(encode_bindings(bindings), self._proposed(bindings))

    def _due(self) -> dict[str, str]:
        members = self._history.current()
        due: dict[str, str] = {}
        me = members.get(self._name)
        if me is not None and not me.storage and self.identity.founder:
            due[self._name] = self.token
        for name, token in self._founders_seen.items():
            if name in members and not members[name].storage:
                due[name] = token
        for name, arrival in self._arrivals.items():
            record = members.get(name)
            if record is None or record.storage == arrival.token or arrival.token == "(none)":
                continue
            if arrival.match >= arrival.target:
                log.info("member %s (storage %s) holds index %d, the commit index when it arrived: "
                         "recording its storage", name, arrival.token, arrival.match)
                due[name] = arrival.token
        return due

    def _proposed(self, bindings: dict[str, str]) -> Callable[[Any, int], None]:
        def done(_result: Any, error: int) -> None:
            self._in_flight = False
            if error == FAIL_REASON.SUCCESS:
                self._founders_seen = {n: t for n, t in self._founders_seen.items() if n not in bindings}
                log.info("storages recorded (committed): %s; each counts from now on",
                         ", ".join(f"{n}={t}" for n, t in sorted(bindings.items())))
            else:
                self._retry_at = self._clock() + RETRY_S
                log.info("recording storages %s did not commit (pysyncobj error %d); retrying",
                         ", ".join(sorted(bindings)), error)
        return done

    def status(self) -> dict[str, Any]:
        return {"storage": self.token, "voter": self._refusal is None, "vote_refusal": self._refusal,
                "storages_catching_up": {n: {"storage": a.token, "holds": a.match, "needs": a.target}
                                         for n, a in list(self._arrivals.items())}}
