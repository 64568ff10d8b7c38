"""Translation between pysyncobj's command bytes and CommitLog entries.

pysyncobj hands its journal opaque *command* bytes; their first byte is the
command type (``0`` regular, ``1`` no-op, ``2`` membership, ``3`` version) and a
regular command is ``b"\\x00" + pickle((func_id, args))``. The CommitLog stores
entries as ``(kind, body)`` instead, so that a DATA entry's body is exactly the
broker's batch and a message's CommitLog position means the same bytes on every
replica:

    command bytes                          CommitLog entry
    ------------------------------------   ------------------------------
    b"\\x01"                                NOOP, body b""
    b"\\x00" + pickle((APPEND_FUNC_ID,      DATA, body = payload
                      (payload,)))
    anything else                          RAFT, body = command bytes

Only ``APPEND_FUNC_ID`` (the id pysyncobj gives the node's single replicated
method) is recognised; ``encode_command`` rebuilds an equivalent command for
pysyncobj when it reads an entry back (pysyncobj only unpickles it, so any
pickle protocol works; protocol 5 stores bytes without re-encoding them).

This module also installs the wire codec hook: pysyncobj's TCP connection reaches
``pickle`` and ``zlib`` through module attributes; ``install_wire_codec`` points
them at protocol-5 pickling and zlib level 0 (stored blocks), which removes the
latin-1 re-encoding of ``bytes`` and most of the CPU spent per replicated byte.
All nodes of a group run this code, so both ends agree.
"""

from __future__ import annotations

import pickle
import types
import zlib

from dledger.storage.entry_format import EntryKind

__all__ = ["APPEND_FUNC_ID", "decode_command", "encode_command", "install_wire_codec"]

APPEND_FUNC_ID = 0
_REGULAR = 0
_NOOP = 1
_NOOP_COMMAND = b"\x01"


def encode_payload_command(payload: bytes) -> bytes:
    """The regular command a node proposes for a DATA payload."""
    return b"\x00" + pickle.dumps((APPEND_FUNC_ID, (payload,)), protocol=5)


def decode_command(command: bytes) -> tuple[EntryKind, bytes]:
    """Split pysyncobj command bytes into the CommitLog's (kind, body)."""
    if command == _NOOP_COMMAND:
        return EntryKind.NOOP, b""
    if command[:1] == b"\x00":
        try:
            decoded = pickle.loads(command[1:])
        except Exception:  # not ours: keep it verbatim
            return EntryKind.RAFT, bytes(command)
        if (
            isinstance(decoded, tuple)
            and len(decoded) == 2
            and decoded[0] == APPEND_FUNC_ID
            and isinstance(decoded[1], tuple)
            and len(decoded[1]) == 1
            and isinstance(decoded[1][0], bytes)
        ):
            return EntryKind.DATA, decoded[1][0]
    return EntryKind.RAFT, bytes(command)


def encode_command(kind: EntryKind, body: bytes) -> bytes:
    """Inverse of ``decode_command`` (equivalent bytes, not necessarily equal)."""
    if kind == EntryKind.NOOP:
        return _NOOP_COMMAND
    if kind == EntryKind.DATA:
        return encode_payload_command(body)
    return body


def _dumps5(obj: object, protocol: int | None = None) -> bytes:
    return pickle.dumps(obj, protocol=5)


def _compress0(data: bytes, level: int = 0) -> bytes:
    return zlib.compress(data, 0)


_installed = False


def install_wire_codec() -> None:
    """Point pysyncobj's TCP connection at protocol-5 pickle and zlib level 0.

    Idempotent and process-wide (a module-level hook, see the notes on
    pysyncobj); must run before any node connects.
    """
    global _installed
    if _installed:
        return
    from pysyncobj import tcp_connection

    pickle_shim = types.SimpleNamespace(dumps=_dumps5, loads=tcp_connection.pickle.loads)
    zlib_shim = types.SimpleNamespace(compress=_compress0, decompress=zlib.decompress)
    tcp_connection.pickle = pickle_shim
    tcp_connection.zlib = zlib_shim
    _installed = True
