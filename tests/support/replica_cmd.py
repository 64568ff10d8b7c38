"""``raftmq replica ...`` run as an operator would, for the membership tests."""

from __future__ import annotations

import subprocess
import sys

__all__ = ["finished", "replica_cmd"]


def replica_cmd(servers: list[str], *args: str, timeout_s: int = 120) -> subprocess.Popen[str]:
    """Start ``raftmq replica ARGS --servers ...`` (output captured); end it with ``finished``."""
    return subprocess.Popen([sys.executable, "-m", "raftmq", "replica", *args,
                             "--servers", ",".join(servers), "--timeout", str(timeout_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finished(proc: subprocess.Popen[str], what: str = "raftmq replica", timeout: float = 180) -> str:
    """Its output, once it exited 0 (killed by PID if it outlives ``timeout``)."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, f"{what}: {out}"
    return out
