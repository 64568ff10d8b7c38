"""Every change RaftMQ makes to pysyncobj 0.3.17 (pinned in pyproject.toml), with one entry
point: ``install_patches()``, called by ``ReplicatedLog`` before it builds a node. Each patch
lives beside the code it serves; this module is the list:

    dledger.raft.codec        tcp_connection.pickle/zlib     protocol-5 pickle, zlib level 0
    dledger.raft.peer_crypto  syncobj.getEncryptor           PeerCipher from conf.password
    dledger.raft.peer_guard   tcp_server.TcpConnection       accepted sockets guarded
    dledger.raft.journal      pysyncobj loggers' filters     two false alarms dropped
    dledger.raft.node         syncobj.createJournal          a node takes RaftJournal (at import:
                                                             a SyncObj may only be built after it)

All are process-wide and idempotent (the log filters are added once)."""

from __future__ import annotations

from dledger.raft import node as _node  # noqa: F401  (its import installs the journal injection)
from dledger.raft.codec import install_wire_codec
from dledger.raft.journal import silence_false_truncation_alarm
from dledger.raft.peer_crypto import install_peer_crypto
from dledger.raft.peer_guard import install as install_peer_guard

__all__ = ["install_patches"]

_log_filters_added = False


def install_patches() -> None:
    """Install every pysyncobj patch (idempotent, process-wide); before any node is built."""
    global _log_filters_added
    install_wire_codec()
    install_peer_crypto()
    install_peer_guard()
    if not _log_filters_added:
        silence_false_truncation_alarm()
        _log_filters_added = True
