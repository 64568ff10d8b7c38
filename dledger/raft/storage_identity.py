"""A replica's storage identity: which incarnation of its durable memory this is.

Raft's safety rests on every voter remembering its log and its vote. A replica started
on an empty data directory under an old name (a replaced host), or one that lost its
hard state, or whose log was cut below what it had acknowledged, remembers neither; were
it counted as the voter it replaces, one such loss and one crash elsewhere could elect a
leader without acknowledged entries (issue 24). So every data directory carries an
identity, and the group's membership records which identity each voter has
(``dledger.membership``: the ``storage`` of a member); a replica whose identity is not
the recorded one neither votes nor stands nor counts for a commit until the leader has
fed it the log and recorded its identity (``dledger.raft.storage_rule``, ``storage_binding``).

    <data_dir>/storage-id  (26 bytes, written whole by ``durable_file.atomic_write``)
    ┌───────────┬────────────┬───────────┬───────────┬───────────┐
    │ magic (4) │ version u8 │ kind u8   │ id (16)   │ crc32 (4) │   big-endian; crc32 of
    └───────────┴────────────┴───────────┴───────────┴───────────┘   the 22 bytes before it
      0           4            5           6           22

* ``magic`` is ``b"RMSI"``, ``version`` 1; ``kind`` is ``F`` (founder) or ``J`` (joiner);
* ``id`` is 16 random bytes, drawn once when the identity is made.

Its token, as the membership and the peer messages carry it, is ``f-<32 hex>`` for a
founder, ``j-<32 hex>`` for a joiner. A **founder** storage was formatted deliberately for
a new group (``raftmq replica init``, which ``raftmq cluster up`` and ``scripts/run`` run
for a new cluster): before any identity is recorded for its name, it counts as the voter
of the initial member set. Any other storage is a **joiner**: it counts only once an
identity entry recording it is committed.

When a replica opens its directory (``open_identity``):

    identity   hard state   log            what it is                      identity used
    ---------  -----------  -------------  ------------------------------  -----------------------
    present    present      intact         the storage it was              kept
    absent     absent       empty          a new (replaced) host           new joiner
    absent     present      any            formatted before identities     new founder (upgrade)
    present    absent/bad   any            forgot its vote                 new joiner
    absent     absent       holds entries  forgot its vote                 new joiner
    any        any          cut below the  forgot entries it acknowledged  new joiner
                            commit hint,
                            or repaired

A new joiner identity is written before the replica speaks to anyone, so a crash right
after it changes nothing.

``forget_storage`` (``raftmq replica forget``, on a stopped replica) makes a directory a new
joiner on purpose -- a disk restored from a backup, or one put back after a resync: a new
joiner identity, then the hard state moved aside as ``raft-state.forgotten-<UTC time>`` and a
fresh one in its place with the same term and vote (a replica never votes twice in a term)
and no commit hint. A crash between the steps leaves a joiner too.
"""

from __future__ import annotations

import logging
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from common.durable_file import atomic_write, fsync_directory, read_or_none
from dledger.storage.hard_state import HardState, HardStateFile, probe

__all__ = ["IDENTITY_FILE", "Forgotten", "StorageIdentity", "StorageIdentityError", "forget_storage",
           "format_founder", "open_identity", "read_identity", "write_identity"]

log = logging.getLogger("dledger.replicated_log")

IDENTITY_FILE = "storage-id"
MAGIC = b"RMSI"
VERSION = 1
_BODY = struct.Struct(">4sBc16s")
_CRC = struct.Struct(">I")
SIZE = _BODY.size + _CRC.size
assert SIZE == 26
FOUNDER, JOINER = b"F", b"J"


class StorageIdentityError(ValueError):
    """A directory that cannot be formatted as asked (the message says why and what to do)."""


@dataclass(frozen=True, slots=True)
class StorageIdentity:
    id: bytes  # 16 random bytes
    founder: bool

    @property
    def token(self) -> str:
        """``f-<hex>`` or ``j-<hex>``: how the membership and peer messages name it."""
        return ("f-" if self.founder else "j-") + self.id.hex()

    @classmethod
    def new(cls, founder: bool) -> StorageIdentity:
        return cls(os.urandom(16), founder)

    def encode(self) -> bytes:
        body = _BODY.pack(MAGIC, VERSION, FOUNDER if self.founder else JOINER, self.id)
        return body + _CRC.pack(zlib.crc32(body))

    @classmethod
    def decode(cls, data: bytes) -> StorageIdentity | None:
        """The identity in ``data``, or None if it is not a valid one."""
        if len(data) != SIZE:
            return None
        body = data[:_BODY.size]
        if _CRC.unpack_from(data, _BODY.size)[0] != zlib.crc32(body):
            return None
        magic, version, kind, ident = _BODY.unpack(body)
        if magic != MAGIC or version != VERSION or kind not in (FOUNDER, JOINER):
            return None
        return cls(ident, kind == FOUNDER)


def is_founder_token(token: str) -> bool:
    return token.startswith("f-")


def read_identity(data_dir: Path) -> StorageIdentity | None:
    """The identity of ``data_dir``; None when it has none or it is unreadable."""
    raw = read_or_none(Path(data_dir) / IDENTITY_FILE)
    return StorageIdentity.decode(raw) if raw is not None else None


def write_identity(data_dir: Path, identity: StorageIdentity) -> None:
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    atomic_write(Path(data_dir) / IDENTITY_FILE, identity.encode())


def _holds_state(data_dir: Path) -> list[str]:
    """What in ``data_dir`` shows it already served (empty list: nothing)."""
    found = []
    for name in ("raft-state", "members", "commitlog", "store", "applied.log"):
        path = Path(data_dir) / name
        if path.is_file() or (path.is_dir() and any(path.iterdir())):
            found.append(name)
    return found


def format_founder(data_dir: Path) -> StorageIdentity:
    """Format ``data_dir`` as a founding member's storage of a *new* group (``raftmq
    replica init``). Refuses a directory that already holds an identity or any state: an
    empty replica of an existing group must never start a second history."""
    data_dir = Path(data_dir)
    existing = read_identity(data_dir)
    if existing is not None:
        raise StorageIdentityError(f"{data_dir} is already formatted (storage {existing.token}); "
                                   "init forms a new group from empty directories only")
    held = _holds_state(data_dir)
    if held:
        raise StorageIdentityError(f"{data_dir} already holds {', '.join(held)}: init forms a new group "
                                   "from empty directories only. To replace a host of a running group, "
                                   "start it on an empty directory without init (docs/DEPLOY.md)")
    identity = StorageIdentity.new(founder=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    HardStateFile(data_dir / "raft-state").close()  # term 0, no vote: remembered from here on
    write_identity(data_dir, identity)
    return identity


@dataclass(frozen=True, slots=True)
class Forgotten:
    """What ``forget_storage`` did: the identity before (None: none or unreadable), the new
    joiner's, and where the old hard state went (None: there was none)."""

    was: StorageIdentity | None
    now: StorageIdentity
    hard_state_moved_to: Path | None


def forget_storage(data_dir: Path, clock: float | None = None) -> Forgotten:
    """Make ``data_dir`` (its replica stopped) a new joiner storage of its group (module
    docstring): it then catches up and votes only once the leader has recorded it. Its log
    and derived state are kept. Raises StorageIdentityError when there is no such directory."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise StorageIdentityError(f"{data_dir} is not a directory: nothing to forget")
    was = read_identity(data_dir)
    now = StorageIdentity.new(founder=False)
    write_identity(data_dir, now)  # first: from here on it does not count, whatever happens next
    state = data_dir / "raft-state"
    moved: Path | None = None
    _, old = probe(state)
    if state.exists():
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(clock))
        moved = state.with_name(f"raft-state.forgotten-{stamp}")
        os.replace(state, moved)
        fsync_directory(data_dir)
    # its term and vote are kept (a replica must never vote twice in one term, whatever its
    # storage); the commit hint is not: it described the log before the restore
    fresh = HardStateFile(state)
    if old is not None:
        fresh.save(HardState(old.term, old.voted_for, 0))
    fresh.close()
    log.warning("%s made a new storage %s (was %s)%s", data_dir, now.token, was.token if was else "none",
                f"; its hard state moved aside to {moved.name}" if moved else "")
    return Forgotten(was, now, moved)


def open_identity(data_dir: Path, *, hard_state: str, log_holds_entries: bool,
                  forgot: str | None) -> tuple[StorageIdentity, str | None]:
    """The identity this replica runs with (the table in the module docstring) and, when it
    is a new joiner because the replica may have forgotten something, why.

    ``hard_state``: ``"ok"``, ``"absent"`` or ``"corrupt"``; ``log_holds_entries``: the
    CommitLog holds entries beyond the first no-op; ``forgot``: the log lost entries it had
    acknowledged (the recovery's or repair's cut, said by the caller), else None."""
    data_dir = Path(data_dir)
    raw = read_or_none(data_dir / IDENTITY_FILE)
    identity = StorageIdentity.decode(raw) if raw is not None else None
    reason: str | None = None
    if raw is not None and identity is None:
        reason = "its storage identity file is unreadable"
    elif identity is None and hard_state == "ok":
        identity = StorageIdentity.new(founder=True)
        write_identity(data_dir, identity)
        log.warning("%s has no storage identity (formatted before identities existed): it is "
                    "taken as this replica's founding storage %s", data_dir, identity.token)
        return identity, None
    elif identity is None and hard_state == "absent" and not log_holds_entries:
        identity = StorageIdentity.new(founder=False)
        write_identity(data_dir, identity)
        log.warning("%s is empty and was not formatted for a new group: it starts as a new storage "
                    "(%s) of an existing group -- it catches up from the leader and votes once the "
                    "leader has recorded it. To form a new group instead, stop it and run "
                    "`raftmq replica init` first", data_dir, identity.token)
        return identity, None
    elif hard_state != "ok":
        reason = f"its Raft hard state (term and vote) is {hard_state}"
    elif forgot is not None:
        reason = forgot
    if reason is None and identity is not None:
        return identity, None
    if reason is None:
        reason = "it has no storage identity and no hard state"
    fresh = StorageIdentity.new(founder=False)
    write_identity(data_dir, fresh)
    log.warning("this replica may have forgotten what it acknowledged (%s): it starts as a new "
                "storage %s (was %s) and neither votes nor stands until it has caught up and the "
                "leader has recorded it", reason, fresh.token, identity.token if identity else "none")
    return fresh, reason
