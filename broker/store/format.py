"""The format of a broker replica's data directory, recorded when it is created.

``<data_dir>/FORMAT`` holds one line, ``raftmq-broker-store <N>``: N is the format of the
entries in its CommitLog and of the files derived from them (``STORE_FORMAT``; 2: message
records, one ConsumeQueue unit per record). A replica refuses to start on a directory of
another format -- or on one that holds derived state (``store/``) but no FORMAT file, which
is format 1 (one message per record) -- with a message that says so: there is no
migration before the first release.
"""

from __future__ import annotations

from pathlib import Path

from common.durable_file import atomic_write

__all__ = ["STORE_FORMAT", "StoreFormatError", "check_store_format"]

STORE_FORMAT = 2
_TAG = "raftmq-broker-store"


class StoreFormatError(Exception):
    """A data directory of another format (the message says which and what to do)."""


def check_store_format(data_dir: Path) -> None:
    """Record the format of a new data directory, or refuse one of another format. Raises
    StoreFormatError, OSError."""
    marker = data_dir / "FORMAT"
    try:
        text = marker.read_text().strip()
    except FileNotFoundError:
        text = None
    if text is None:
        store = data_dir / "store"
        if (store / "state.checkpoint").exists() or any((store / "consumequeue").glob("*")):
            _refuse(data_dir, 1)
        atomic_write(marker, f"{_TAG} {STORE_FORMAT}\n".encode())
        return
    tag, _, number = text.partition(" ")
    if tag != _TAG or not number.isdigit():
        raise StoreFormatError(f"{marker} is not a RaftMQ store format marker: {text[:80]!r}")
    if int(number) != STORE_FORMAT:
        _refuse(data_dir, int(number))


def _refuse(data_dir: Path, found: int) -> None:
    raise StoreFormatError(
        f"the data directory {data_dir} is of store format {found}; this broker reads format "
        f"{STORE_FORMAT} only (messages stored as records of 1..N). There is no migration before "
        "the first release: move the directory away (or delete it) and start the replica again; "
        "it will catch up from its peers, or start empty")
