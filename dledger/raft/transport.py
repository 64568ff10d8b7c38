"""pysyncobj node and transport classes for a RaftMQ group.

* ``PeerNode`` keeps a peer's Raft identity (its configured address) while the
  connection is dialed at another address -- a Toxiproxy listener in the chaos
  tests. pysyncobj dials ``node.ip``/``node.port`` and identifies a node by
  ``node.address``, so only those two properties change.

* ``GroupTransport`` (a ``TCPTransport``) introduces a *learner* -- a replica
  catching up before it is a member -- as pysyncobj's read-only peer: it dials
  every member and says ``readonly``, so the leader feeds it entries (and the
  retained start) without counting it for the majority; once its own log says it
  is a member it reconnects under its address. On the send path it adds:

  1. **flush before send** (flush policy ``sync``): every outgoing message is
     preceded by ``journal.flush()``. A follower therefore fsyncs the entries
     it just appended before it acknowledges them, and a leader fsyncs its own
     new entries before any follower can receive (and so acknowledge) them --
     an entry can only become committed once a majority holds it on disk.
     All entries appended in one tick share one fsync (group commit).

  2. **a conflict hint on rejections**: a follower that rejects an
     append (``next_node_idx`` with ``reset`` and no ``success``) because it
     lacks ``prevLogIdx`` tells the leader to resume at its last index + 1.
     When that tail is a stale, unconfirmed one, pipelined rejections make the
     leader's nextIndex oscillate between two values forever (measured: a node
     left unrepaired). The hint is lowered to ``resume_hint`` (confirmed + 1), the first index
     not known to match the current leader; a lower nextIndex is always safe
     (Raft §5.3, the leader just sends more). It never goes below the first
     held entry + 1, which every replica holds identically.

  3. **a full disk is said** (``dledger.storage.disk_guard``): while this node's disk is full,
     every ``next_node_idx`` answer carries ``disk_full: True`` (pysyncobj ignores the
     key), so the leader knows which followers cannot store; and a leader sends such a
     follower its appends without their entries (heartbeats: the follower would refuse
     them, and resending a growing backlog every heartbeat costs the leader its send
     budget). Sending a follower fewer entries is always safe (Raft §5.3); once its
     answers say it has room, the entries flow again from where it stands.

  4. **the storage token** (``dledger.raft.storage_binding``): every answer -- ``next_node_idx``,
     ``response_vote``, ``pre_vote_response`` -- says which storage identity sent it, so
     the leader and candidates count only the storages the membership records.

On the receive path, ``intercept`` (``dledger.raft.election.prevote``, the leader's note of full disks)
sees every message first and consumes pre-vote's own two message types. An append whose
entries the disk cannot take (the journal raises ``EntryNotStored`` out of pysyncobj's
handler, which then sent nothing) is answered here: a rejection asking the leader to
resume after what this node holds -- it resends later -- which also keeps the leader's
lease, so a full disk starts no elections. Accepted connections are bounded before they
have proved they belong to the group (``dledger.raft.peer_guard``): frame sizes, bytes, how many
may be in their handshake at once and for how long. A peer that proves the secret but
introduces itself under an address that is not one of this replica's members is refused
(pysyncobj) with a WARNING naming it, once a minute per address: the mark of a
``group.peers`` that differs between hosts (issue 34: it was refused in silence).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.node import TCPNode
from pysyncobj.transport import TCPTransport

from dledger.raft.journal import EntryNotStored
from dledger.raft.peer_guard import PendingHandshakes, install
from dledger.stage_clock import StageClock

log = logging.getLogger("dledger.transport")
STRANGER_WARN_EVERY_S = 60.0
STRANGERS_REMEMBERED = 256

install()

__all__ = ["GroupTransport", "PeerNode", "make_transport_class"]


class PeerNode(TCPNode):
    """A Raft peer identified by ``address`` and dialed at ``dial`` (default: the same);
    ``name`` is the replica's name in the group."""

    def __init__(self, address: str, dial: str | None = None, name: str = "") -> None:
        super().__init__(address)
        self.name = name
        host, port = (dial or address).rsplit(":", 1)
        self._dial_host = host
        self._dial_port = int(port)

    @property
    def ip(self) -> str:
        return globalDnsResolver().resolve(self._dial_host)

    @property
    def port(self) -> int:
        return self._dial_port

    @property
    def dial_address(self) -> str:
        return f"{self._dial_host}:{self._dial_port}"


class GroupTransport(TCPTransport):
    """TCPTransport with flush-before-send and the conflict hint (module docstring)."""

    flush_before_send: Callable[[], Any] | None = None
    resume_hint: Callable[[], int] | None = None
    is_learner: Callable[[], bool] | None = None
    created: Callable[[GroupTransport], None] | None = None
    #: sees every message first; True consumes it (pre-vote's own messages)
    intercept: Callable[[Any, dict[str, Any]], bool] | None = None
    #: whether this node's disk is full (said in every next_node_idx answer)
    disk_full: Callable[[], bool] | None = None
    #: on a leader: whether a follower's last answer said its disk is full
    follower_full: Callable[[Any], bool] | None = None
    #: every outgoing message passes through it (the storage token on answers)
    stamp: Callable[[Any], Any] | None = None
    #: told of appends sent, acks read and acks sent (``dledger.stage_clock``)
    stages: StageClock | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._handshakes = PendingHandshakes()
        super().__init__(*args, **kwargs)
        if self.created is not None:
            self.created(self)

    # -- strangers: bounded in number and time until they are matched to a node -------
    def _onNewIncomingConnection(self, conn: Any) -> None:
        super()._onNewIncomingConnection(conn)
        self._handshakes.accepted(conn, self._unknownConnections)

    def _onTick(self) -> None:
        super()._onTick()
        self._handshakes.sweep(self._unknownConnections)

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:
        # After the secret's handshake a peer says its address (or "readonly": a learner);
        # pysyncobj drops one it does not know without a word.
        if isinstance(message, str) and message != "readonly" and message not in self._nodeAddrToNode:
            warned = self.__dict__.setdefault("_strangers_warned", {})
            if len(warned) >= STRANGERS_REMEMBERED:  # names a peer sends: bounded
                warned.clear()
            now = time.monotonic()
            if now - warned.get(message, -STRANGER_WARN_EVERY_S) >= STRANGER_WARN_EVERY_S:
                warned[message] = now
                known = ", ".join(sorted(str(a) for a in self._nodeAddrToNode))
                log.warning("refused a Raft peer introducing itself as %s: not a member this replica knows "
                            "(%s). Its group.peers and this one's differ -- they must be identical on every "
                            "host (docs/DEPLOY.md) -- or it was removed from the group "
                            "(repeats are logged once a minute)", message, known)
        super()._onIncomingMessageReceived(conn, message)

    # -- a learner dials everyone and introduces itself as read-only ---------------
    def _learning(self) -> bool:
        return self.is_learner is not None and self.is_learner()

    def _shouldConnect(self, node: Any) -> bool:
        if self._learning():
            return isinstance(node, TCPNode) and node not in self._preventConnectNodes
        return bool(super()._shouldConnect(node))

    def _sendSelfAddress(self, conn: Any) -> None:
        if self._learning():
            self.__dict__.setdefault("_said_readonly", set()).add(conn)
            conn.send("readonly")
        else:
            super()._sendSelfAddress(conn)

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        if self.intercept is not None and isinstance(message, dict) and self.intercept(node, message):
            return
        kind = message.get("type") if isinstance(message, dict) else None
        stages = self.stages
        if stages is not None and kind == "append_entries":
            stages.receiving(True)
        try:
            super()._onMessageReceived(node, message)
            if stages is not None and kind == "next_node_idx" and message.get("success"):
                stages.acked(message["next_node_idx"] - 1)
        except EntryNotStored:
            if isinstance(message, dict) and message.get("type") == "append_entries":
                assert self.resume_hint is not None
                self.send(node, {"type": "next_node_idx", "next_node_idx": self.resume_hint(),
                                 "reset": True, "success": False})
            # otherwise a new leader's no-op: it leads without it and hands over
        finally:
            if stages is not None and kind == "append_entries":
                stages.receiving(False)

    def reintroduce(self) -> None:
        """Drop every connection made as a learner: each is made again under this node's
        address (by whichever side dials). Tick thread only."""
        for conn in self.__dict__.pop("_said_readonly", set()):
            conn.disconnect()

    def send(self, node: Any, message: Any) -> bool:
        if isinstance(message, dict) and "transmission" in message:
            # pysyncobj's chunked path for entries >= appendEntriesBatchSizeBytes (defect 3):
            # unreachable by construction; refuse loudly rather than corrupt a follower.
            raise RuntimeError("an entry reached pysyncobj's chunked transmission path")
        if self.flush_before_send is not None:
            self.flush_before_send()
        if (self.follower_full is not None and isinstance(message, dict) and message.get("entries")
                and message.get("type") == "append_entries" and self.follower_full(node)):
            message = {**message, "entries": []}
        if isinstance(message, dict) and message.get("type") == "next_node_idx":
            if self.resume_hint is not None and message.get("reset") and not message.get("success"):
                hint = self.resume_hint()
                if message["next_node_idx"] > hint:
                    message = {**message, "next_node_idx": hint}
            if self.disk_full is not None and self.disk_full():
                message = {**message, "disk_full": True}
        if self.stamp is not None:
            message = self.stamp(message)
        sent = bool(super().send(node, message))
        if self.stages is not None and sent and isinstance(message, dict):
            self._note_sent(self.stages, message)
        return sent

    @staticmethod
    def _note_sent(stages: StageClock, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "append_entries" and message.get("entries"):
            stages.sent(message["entries"][-1][1])
        elif kind == "next_node_idx" and message.get("success"):
            stages.ack_sent(message["next_node_idx"] - 1)


def make_transport_class(
    flush_before_send: Callable[[], Any] | None, resume_hint: Callable[[], int],
    is_learner: Callable[[], bool] | None = None,
    created: Callable[[GroupTransport], None] | None = None,
    disk_full: Callable[[], bool] | None = None,
    follower_full: Callable[[Any], bool] | None = None,
    stages: StageClock | None = None,
) -> type[GroupTransport]:
    """A GroupTransport subclass bound to one node's journal (pysyncobj takes a class)."""
    return type(
        "BoundGroupTransport",
        (GroupTransport,),
        {
            "flush_before_send": staticmethod(flush_before_send) if flush_before_send else None,
            "resume_hint": staticmethod(resume_hint),
            "is_learner": staticmethod(is_learner) if is_learner else None,
            "created": staticmethod(created) if created else None,
            "disk_full": staticmethod(disk_full) if disk_full else None,
            "follower_full": staticmethod(follower_full) if follower_full else None,
            "stages": stages,
        },
    )
