"""HTTP calls of the ``raftmq`` tools (cluster status and verify, leader transfer, replica
changes) to replicas and name servers -- https when the cluster serves TLS.

How a command finds its TLS: ``--ca-file``/``--cert-file``/``--key-file``/``--tls``; else
the ``cluster.json`` of ``--dir`` (``raftmq cluster up --tls`` writes the local CA there);
else ``$RAFTMQ_CA_FILE`` and friends (``protocol.tls``).
"""

from __future__ import annotations

import argparse
import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client.cli import cli_tls
from protocol.tls import ClientTls, http_url, resolve_tls

__all__ = ["ClusterHttp"]


@dataclass(frozen=True)
class ClusterHttp:
    """JSON over HTTP(S) to a cluster's ports."""

    tls: ClientTls | None = None
    _context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, args: argparse.Namespace) -> ClusterHttp:
        """The TLS ``args`` ask for (module docstring)."""
        where = getattr(args, "dir", None)
        state_path = Path(where or ".") / "cluster.json"
        state = json.loads(state_path.read_text()) if where and state_path.exists() else None
        return cls.with_tls(resolve_tls(cli_tls(args, state)))

    @classmethod
    def with_tls(cls, tls: ClientTls | None) -> ClusterHttp:
        return cls(tls, tls.context() if tls is not None else None)

    def url(self, address: str, path: str) -> str:
        return http_url(address, path, self.tls is not None)

    def get(self, address: str, path: str, timeout: float = 5.0) -> Any:
        """The JSON answer of a GET; OSError (urllib's errors among them) when it fails."""
        with urllib.request.urlopen(self.url(address, path), timeout=timeout, context=self._context) as resp:
            return json.loads(resp.read())

    def call(self, address: str, path: str, body: dict[str, Any] | None = None,
             timeout: float = 30.0) -> tuple[int, dict[str, Any]]:
        """(status, JSON answer) of a GET, or a POST of ``body``; an error status is returned,
        not raised; OSError when the address cannot be reached."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url(address, path), data=data,
                                         method="GET" if body is None else "POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self._context) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            try:
                return e.code, json.loads(e.read() or b"{}")
            except ValueError:
                return e.code, {"error": e.reason}
