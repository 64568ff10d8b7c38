"""Offline checks of broker replicas' CommitLogs (read from disk after the processes stopped).

``read_log`` opens a replica's ``<data_dir>/commitlog`` with ``dledger.storage.commitlog.CommitLog``
(only after its process has exited: opening runs recovery, which may cut a torn tail)
and returns every entry. ``compare_logs`` compares replicas entry by entry (index,
term, kind, position, body) and segment file by segment file, and says how much it
compared (``log_differences``: its problems only). ``committed_offsets``
lists the consumer-offset commits a log holds, in log order.
"""

from __future__ import annotations

import filecmp
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from broker.store.commands import CommitOffset, RecordKind, decode_admin, record_kind
from broker.store.entry_batch import unpack_entry
from client.queues import MessageQueue
from dledger.storage.commitlog import CommitLog
from dledger.storage.entry_format import Entry, EntryKind

__all__ = ["LogComparison", "committed_offsets", "compare_logs", "log_differences", "read_log"]

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


@dataclass(frozen=True, slots=True)
class LogComparison:
    """What ``compare_logs`` compared (entries per replica, segment files byte for byte) and
    why the logs are not identical ([] if they are)."""

    entries: int
    files: int
    problems: list[str]


def log_differences(logs: dict[str, list[Entry]], dirs: dict[str, Path] | None = None,
                    common_range: bool = False) -> list[str]:
    """Why the replicas' logs are not identical ([] if they are): ``compare_logs``'s problems."""
    return compare_logs(logs, dirs, common_range).problems


def compare_logs(logs: dict[str, list[Entry]], dirs: dict[str, Path] | None = None,
                 common_range: bool = False) -> LogComparison:
    """Compare the replicas' logs entry by entry; ``dirs`` (replica -> data dir) adds a
    byte-for-byte comparison of the segment files. ``common_range`` (retention active:
    replicas delete their log's start at different times): only the entries and segment
    files every replica still holds are compared, the first common file from the first
    common entry on (a replica that restarted its log there holds zeros before it).
    Nothing compared is a problem: no entry at all, or no segment file when ``dirs`` is given."""
    problems: list[str] = []
    names = sorted(logs)
    if common_range and all(logs.values()):
        start = max(log[0].index for log in logs.values())
        logs = {n: [e for e in log if e.index >= start] for n, log in logs.items()}
    ref = logs[names[0]]
    if not any(logs.values()):
        problems.append("no log entry to compare: every replica's log is empty")
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
    files: list[str] = []
    if dirs and not problems:
        base = dirs[names[0]] / "commitlog"
        files = sorted(p.name for p in base.iterdir() if p.name.isdigit())
        from_position = 0  # where the first file's comparison begins (absolute log position)
        if common_range:
            for name in names[1:]:
                held = {p.name for p in (dirs[name] / "commitlog").iterdir()}
                files = [f for f in files if f in held]
            from_position = ref[0].position if ref else 0
        if not files:
            problems.append("no segment file to compare byte for byte")
        for name in names[1:]:
            other_dir = dirs[name] / "commitlog"
            theirs = sorted(p.name for p in other_dir.iterdir() if p.name.isdigit())
            if common_range:
                theirs = [f for f in theirs if f in files]
            if theirs != files:
                problems.append(f"{name}'s segment files {theirs} differ from {names[0]}'s {files}")
                continue
            differ = [f for f in files if not _same_bytes(base / f, other_dir / f, from_position - int(f))]
            if differ:
                since = f" (from the first common entry at position {from_position} on)" * bool(from_position)
                problems.append(f"segment files {differ} of {name} are not byte-identical to {names[0]}'s"
                                + since)
    return LogComparison(sum(len(log) for log in logs.values()) // max(1, len(logs)), len(files), problems)


def _same_bytes(a: Path, b: Path, skip: int) -> bool:
    """The two files are equal byte for byte after their first ``skip`` bytes (none if <= 0)."""
    if skip <= 0:
        return filecmp.cmp(a, b, shallow=False)
    with a.open("rb") as fa, b.open("rb") as fb:
        fa.seek(skip)
        fb.seek(skip)
        while True:
            ca, cb = fa.read(1 << 20), fb.read(1 << 20)
            if ca != cb:
                return False
            if not ca:
                return True


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
