"""Small tmpfs mounts for disk-full tests: a replica's data directory on a file system of a
few MiB that a test fills, then gives more room (``resize``) -- without stopping anything.

Mounting needs root (``mount -t tmpfs``); ``require_mount`` FAILS a test that cannot (the
disk-full tests are part of the suite, and ``scripts/test`` fails on any skip anyway): run
the suite as root, as CI does.
Every mount is unmounted when its context ends, whatever happened (lazily if a process
still holds a file there: the processes are stopped first by whoever started them).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["TmpfsMount", "require_mount", "tmpfs"]


def require_mount() -> None:
    """Fail the calling test unless this process may mount file systems (root)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.fail("mounting a tmpfs needs root and mount(8): run the suite as root (CI does)",
                    pytrace=False)


class TmpfsMount:
    """A tmpfs mounted at ``path``."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size

    def resize(self, size: int) -> None:
        """Give the file system ``size`` bytes (files stay; writers notice at their next write)."""
        _run("mount", "-o", f"remount,size={size}", str(self.path))
        self.size = size

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.path).free


@contextlib.contextmanager
def tmpfs(path: Path, size: int) -> Iterator[TmpfsMount]:
    """Mount a tmpfs of ``size`` bytes at ``path`` (created if missing) for the context."""
    path.mkdir(parents=True, exist_ok=True)
    _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path))
    try:
        yield TmpfsMount(path, size)
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            _run("umount", "-l", str(path))


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
