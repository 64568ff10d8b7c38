"""Damage done to a stopped replica's CommitLog files by fault tests."""

from __future__ import annotations

from pathlib import Path

__all__ = ["flip_a_byte"]


def flip_a_byte(commitlog: Path, position: int) -> None:
    """Invert the byte at absolute CommitLog ``position`` of a stopped replica (valid records
    follow a record damaged mid-log: recovery calls it corruption, not a torn tail)."""
    segments = sorted((int(p.name), p) for p in commitlog.iterdir() if p.name.isdigit())
    start, path = max((s, p) for s, p in segments if s <= position)
    with open(path, "r+b") as f:
        f.seek(position - start)
        byte = f.read(1)
        f.seek(position - start)
        f.write(bytes([byte[0] ^ 0xFF]))
