"""A local cluster (``raftmq cluster up``: a name server and one 3-node broker group) for the
name-server security tests, and small HTTP helpers. Every process is stopped by PID."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.tls import ClientTls

__all__ = ["Cluster", "http_json", "local_cluster", "raftmq"]


def raftmq(*args: str, timeout: float = 120, stdin: str | None = None,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``raftmq ARGS`` in a process; ``env``: variables over this process's environment."""
    return subprocess.run([sys.executable, "-m", "raftmq", *args], capture_output=True, text=True,
                          timeout=timeout, input=stdin, env={**os.environ, **(env or {})})


def http_json(url: str, body: Any = None, headers: dict[str, str] | None = None,
              data: bytes | None = None, tls: ClientTls | None = None) -> tuple[int, Any]:
    """(status, decoded JSON body) of a GET, or a POST of ``body`` as JSON (or raw ``data``);
    an https ``url`` is verified against ``tls``'s CA."""
    if data is None and body is not None:
        data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10, context=tls.context() if tls else None) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw or b"null")
        except ValueError:
            return e.code, raw.decode(errors="replace")


@dataclass
class Cluster:
    root: Path

    @property
    def state(self) -> dict[str, Any]:
        return dict(json.loads((self.root / "cluster.json").read_text()))

    @property
    def ns(self) -> str:
        return str(self.state["namesrv"]["address"])

    def nodes(self) -> dict[str, dict[str, Any]]:
        return dict(self.state["groups"]["g1"])

    def leader(self) -> tuple[str, str]:
        """(node, client address) of the replica that says it leads g1."""
        for name, info in self.nodes().items():
            code, status = http_json(f"http://{info['address']}/status")
            if code == 200 and status["role"] == "leader":
                return name, info["address"]
        raise AssertionError("no replica of g1 leads")


@contextlib.contextmanager
def local_cluster(root: Path, *flags: str) -> Iterator[Cluster]:
    """``raftmq cluster up --dir root [flags]`` (e.g. ``--tls``); on exit ``cluster down``
    (SIGTERM by PID, SIGKILL after 10 s)."""
    up = raftmq("cluster", "up", "--dir", str(root), *flags)
    cluster = Cluster(root)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield cluster
    finally:
        raftmq("cluster", "down", "--dir", str(root), timeout=60)
