"""Temporary directories in RAM (tmpfs, ``/dev/shm``) for tests of the apply step's logic.

Those tests checkpoint hundreds of times, and every checkpoint fsyncs its files: on the
disk (shared with other work) the fsyncs were 60-70 % of their time; on tmpfs an fsync
costs nothing. What they check -- results, bytes, a replay from a checkpoint put back by
hand -- does not depend on the data reaching a disk (durability across real crashes is the
cluster and chaos tests' subject). Without a writable ``/dev/shm`` the default temporary
directory is used. A test module moves its ``tmp_path`` there with::

    @pytest.fixture
    def tmp_path() -> Iterator[Path]:
        yield from ram_dir()
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["RAM_DIR", "ram_dir"]

#: Where to make temporary directories: tmpfs if there is one to write, else None (the default).
RAM_DIR: str | None = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def ram_dir(prefix: str = "raftmq-test-") -> Iterator[Path]:
    """Yields a fresh directory, in RAM where possible, and deletes it afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=RAM_DIR))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
