"""The files of one ConsumeQueue (``broker.store.consume_queue``): ``QueueFile``, reading its units,
and adopting the files found on disk when a queue opens.

Recovery on open (``adopt_files``): a trailing partial unit (a torn write) is cut, and so
are trailing all-zero units, and an empty last file after another is deleted. Anything else that is
not the layout -- a file whose name is not where the file before ends, a file before
the last that is not full, a file holding more than ``units_per_file`` units, a first
unit whose base is not its file's name -- raises ConsumeQueueCorrupt.

The units' layout: ``broker.store.consume_queue_layout``.
"""

from __future__ import annotations

import os
from pathlib import Path

from broker.store.consume_queue_layout import UNIT, UNIT_SIZE, CqUnit, used_units
from dledger.storage.numbered_files import PendingSync, close_quietly, numbered_files, pread_full, unlink_file

__all__ = ["ConsumeQueueCorrupt", "QueueFile", "adopt_files", "read_units", "unit_at"]


class ConsumeQueueCorrupt(Exception):
    """The files on disk are not a well-formed ConsumeQueue; the message names the file."""


class QueueFile:
    """One file of a queue: its first offset (its name), the offset after its last unit,
    its units, and its descriptor while open (-1 closed)."""

    __slots__ = ("end", "fd", "path", "start", "units")

    def __init__(self, start: int, path: Path, fd: int = -1, units: int = 0, end: int | None = None) -> None:
        self.start = start  # base offset of its first unit (its name)
        self.end = start if end is None else end  # offset after its last unit
        self.path = path
        self.fd = fd
        self.units = units


def unit_at(f: QueueFile, i: int) -> CqUnit:
    """Unit ``i`` of file ``f`` (``f`` open or not)."""
    p, s, c, kind, _, b, t, tag = UNIT.unpack(read_units(f, i, 1))
    return CqUnit(p, s, c, kind, b, t, tag)


def read_units(f: QueueFile, i: int, n: int) -> bytes:
    """The bytes of ``n`` units of ``f`` from unit ``i``; ConsumeQueueCorrupt when short."""
    size, at = n * UNIT_SIZE, i * UNIT_SIZE
    if f.fd >= 0:
        data = pread_full(f.fd, size, at)
    else:
        fd = os.open(f.path, os.O_RDONLY)
        try:
            data = pread_full(fd, size, at)
        finally:
            os.close(fd)
    if len(data) != size:
        raise ConsumeQueueCorrupt(f"consume queue file {f.path} is shorter than expected: "
                                  f"{size} bytes at {at}")
    return data


def adopt_files(directory: Path, units_per_file: int, pending: PendingSync[QueueFile]) -> list[QueueFile]:
    """The files of the queue in ``directory`` as found, the end of the last recovered
    (module docstring); only the last is left open (none on an error). ``pending``: what
    the next flush syncs (a cut file, a deleted one). Raises ConsumeQueueCorrupt, OSError."""
    files: list[QueueFile] = []
    try:
        found = numbered_files(directory)
        for n, (start, path) in enumerate(found):
            f = QueueFile(start, path, os.open(path, os.O_RDWR))
            files.append(f)
            length = os.fstat(f.fd).st_size
            f.units = length // UNIT_SIZE
            if n < len(found) - 1 and length != units_per_file * UNIT_SIZE:
                raise ConsumeQueueCorrupt(f"consume queue file {path} has {length} bytes but is not "
                                          f"the last file, so it must be full ({units_per_file * UNIT_SIZE})")
            if f.units > units_per_file:
                raise ConsumeQueueCorrupt(f"consume queue file {path} holds more than units_per_file "
                                          f"{units_per_file} units")
            if n == len(found) - 1:
                f.units = used_units(pread_full(f.fd, f.units * UNIT_SIZE, 0))
                if f.units * UNIT_SIZE != length:
                    os.ftruncate(f.fd, f.units * UNIT_SIZE)
                    pending.wrote(f)
            if f.units:
                first, final = unit_at(f, 0), unit_at(f, f.units - 1)
                if first.base != start:
                    raise ConsumeQueueCorrupt(f"consume queue file {path} starts with offset {first.base}")
                f.end = final.end
            if n < len(found) - 1:
                os.close(f.fd)
                f.fd = -1
            if n and start != files[-2].end:
                raise ConsumeQueueCorrupt(f"consume queue files in {directory} are not contiguous: "
                                          f"{files[-2].path.name} ends at {files[-2].end}, "
                                          f"the next is {path.name}")
        if len(files) > 1 and files[-1].units == 0:
            unlink_file(files.pop(), pending)
            prev = files[-1]
            prev.fd = os.open(prev.path, os.O_RDWR)
    except BaseException:
        close_quietly(f.fd for f in files if f.fd >= 0)
        raise
    return files
