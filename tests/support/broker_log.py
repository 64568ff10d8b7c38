"""Offline checks of broker replicas' CommitLogs (read from disk after the processes stopped).

``read_log`` opens a replica's ``<data_dir>/commitlog`` with ``dledger.storage.commitlog.CommitLog``
(only after its process has exited: opening runs recovery, which may cut a torn tail)
and returns every entry. ``log_differences`` compares replicas entry by entry (index,
term, kind, position, body) and segment file by segment file. ``committed_offsets``
lists the consumer-offset commits a log holds, in log order.
"""

from __future__ import annotations

import filecmp
from collections import defaultdict
from pathlib import Path

from broker.store.commands import CommitOffset, RecordKind, decode_admin, record_kind
from broker.store.entry_batch import unpack_entry
from client.queues import MessageQueue
from dledger.storage.commitlog import CommitLog
from dledger.storage.entry_format import Entry, EntryKind

__all__ = ["committed_offsets", "log_differences", "read_log"]

_CHUNK_BYTES = 8 << 20


def read_log(data_dir: Path, segment_bytes: int) -> list[Entry]:
    """Every entry of the CommitLog under ``data_dir`` (the process must have exited)."""
    log = CommitLog(data_dir / "commitlog", segment_bytes)
    try:
        out: list[Entry] = []
        index = log.first_index
        while True:
            chunk = log.entries(index, _CHUNK_BYTES) if index else []
            if not chunk:
                return out
            out.extend(chunk)
            index = chunk[-1].index + 1
    finally:
        log.close()


def log_differences(logs: dict[str, list[Entry]], dirs: dict[str, Path] | None = None,
                    common_range: bool = False) -> list[str]:
    """Why the replicas' logs are not identical ([] if they are). ``dirs`` (replica ->
    data dir) adds a byte-for-byte comparison of the segment files. ``common_range``
    (retention active: replicas delete their log's start at different times): only the
    entries and segment files every replica still holds are compared."""
    problems: list[str] = []
    names = sorted(logs)
    if common_range and all(logs.values()):
        start = max(log[0].index for log in logs.values())
        logs = {n: [e for e in log if e.index >= start] for n, log in logs.items()}
    ref = logs[names[0]]
    for name in names[1:]:
        other = logs[name]
        if len(other) != len(ref) or (ref and (ref[0].index, ref[-1].index) != (other[0].index,
                                                                                 other[-1].index)):
            problems.append(f"{name} holds entries {_span(other)}, {names[0]} {_span(ref)}")
        for a, b in zip(ref, other, strict=False):
            if a != b:
                problems.append(f"{name} differs from {names[0]} at index {a.index}: "
                                f"(term {a.term}, {a.kind.name}, pos {a.position}) vs "
                                f"(index {b.index}, term {b.term}, {b.kind.name}, pos {b.position})")
                break
    if dirs and not problems:
        base = dirs[names[0]] / "commitlog"
        files = sorted(p.name for p in base.iterdir() if p.name.isdigit())
        if common_range:
            for name in names[1:]:
                held = {p.name for p in (dirs[name] / "commitlog").iterdir()}
                files = [f for f in files if f in held]
            files = files[1:]  # the first common one may be partly deleted on one replica
        for name in names[1:]:
            other_dir = dirs[name] / "commitlog"
            theirs = sorted(p.name for p in other_dir.iterdir() if p.name.isdigit())
            if common_range:
                theirs = [f for f in theirs if f in files]
            if theirs != files:
                problems.append(f"{name}'s segment files {theirs} differ from {names[0]}'s {files}")
                continue
            _, mismatch, errors = filecmp.cmpfiles(base, other_dir, files, shallow=False)
            if mismatch or errors:
                problems.append(f"segment files {mismatch + errors} of {name} are not byte-identical "
                                f"to {names[0]}'s")
    return problems


def committed_offsets(entries: list[Entry], consumer_group: str, broker_group: str) -> dict[str, list[int]]:
    """``str(MessageQueue)`` -> the offsets ``consumer_group`` committed for it, in log order."""
    out: dict[str, list[int]] = defaultdict(list)
    for entry in entries:
        if entry.kind != EntryKind.DATA:
            continue
        try:
            records = unpack_entry(entry.body).messages
        except ValueError:
            continue
        for record in records:
            if record_kind(record) != RecordKind.COMMIT_OFFSET:
                continue
            cmd = decode_admin(record)
            if isinstance(cmd, CommitOffset) and cmd.group == consumer_group:
                out[str(MessageQueue(cmd.topic, broker_group, cmd.queue_id))].append(cmd.offset)
    return dict(out)


def _span(entries: list[Entry]) -> str:
    return f"{entries[0].index}..{entries[-1].index}" if entries else "none"
