"""HTTP calls of the ``raftmq`` tools (cluster status and verify, leader transfer, replica
changes) and of the test harnesses to replicas and name servers -- https when the cluster
serves TLS, with an admin token on ``/admin/...`` when a user is given (ACLs on).

How a command finds its TLS: ``--ca-file``/``--cert-file``/``--key-file``/``--tls``; else
the ``cluster.json`` of ``--dir`` (``raftmq cluster up --tls`` writes the local CA there);
else ``$RAFTMQ_CA_FILE`` and friends (``protocol.tls``). Its user: ``--credentials-file``
where the command has it, else ``$RAFTMQ_CREDENTIALS_FILE`` or ``$RAFTMQ_USER`` and
``$RAFTMQ_PASSWORD`` (``client.credentials``); none: no token (a group with ACLs off).
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

from client.cli_cluster import cli_tls
from client.credentials import Credentials
from client.errors import ConnectionLostError
from protocol.tls import ClientTls, http_url, resolve_tls
from raftmq.admin_auth import fetch_admin_token

__all__ = ["ClusterHttp"]

#: paths that need a token when ACLs are on (``broker.security.access_map``: the rest are open)
ADMIN_PREFIX = "/admin"


@dataclass(frozen=True)
class ClusterHttp:
    """JSON over HTTP(S) to a cluster's ports, as ``credentials`` on ``/admin/...``.

    Blocking; one token per replica address, fetched on the first admin call and again
    when a replica refuses it (expired, or the password changed)."""

    tls: ClientTls | None = None
    credentials: Credentials | None = None
    _context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)
    _tokens: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, args: argparse.Namespace) -> ClusterHttp:
        """The TLS and user ``args`` and the environment ask for (module docstring);
        SystemExit naming the problem when the credentials cannot be read."""
        where = getattr(args, "dir", None)
        state_path = Path(where or ".") / "cluster.json"
        state = json.loads(state_path.read_text()) if where and state_path.exists() else None
        try:
            credentials = Credentials.from_env(file=getattr(args, "credentials_file", None))
        except (OSError, ValueError) as e:
            raise SystemExit(f"error: credentials: {e}") from None
        return cls.with_tls(resolve_tls(cli_tls(args, state)), credentials)

    @classmethod
    def with_tls(cls, tls: ClientTls | None, credentials: Credentials | None = None) -> ClusterHttp:
        return cls(tls, credentials, tls.context() if tls is not None else None)

    def url(self, address: str, path: str) -> str:
        return http_url(address, path, self.tls is not None)

    def admin_headers(self, address: str, path: str = ADMIN_PREFIX) -> dict[str, str]:
        """``Authorization`` for ``path`` at ``address``: empty for an open path or without
        credentials. Raises the client's AuthFailedError (a wrong user or password), or
        ConnectionError when the replica cannot be reached (an OSError, as the call's own)."""
        if self.credentials is None or not path.startswith(ADMIN_PREFIX):
            return {}
        token = self._tokens.get(address)
        if token is None:
            try:
                token = fetch_admin_token(address, self.credentials, self.tls)
            except ConnectionLostError as e:
                raise ConnectionError(str(e)) from None
            self._tokens[address] = token
        return {"Authorization": f"Bearer {token}"}

    def get(self, address: str, path: str, timeout: float = 5.0) -> Any:
        """The JSON answer of a GET; OSError (urllib's errors among them) when it fails.
        A refused token is renewed once."""
        try:
            return self._open(address, path, None, timeout)[1]
        except urllib.error.HTTPError as e:
            if e.code != 401 or self._tokens.pop(address, None) is None:
                raise
        return self._open(address, path, None, timeout)[1]

    def call(self, address: str, path: str, body: dict[str, Any] | None = None,
             timeout: float = 30.0) -> tuple[int, dict[str, Any]]:
        """(status, JSON answer) of a GET, or a POST of ``body``; an error status is returned,
        not raised; OSError when the address cannot be reached. A refused token is renewed
        once."""
        code, doc = self._answer(address, path, body, timeout)
        if code == 401 and self._tokens.pop(address, None) is not None:
            code, doc = self._answer(address, path, body, timeout)
        return code, doc

    def _answer(self, address: str, path: str, body: dict[str, Any] | None,
                timeout: float) -> tuple[int, dict[str, Any]]:
        try:
            code, doc = self._open(address, path, body, timeout)
            return code, dict(doc)
        except urllib.error.HTTPError as e:
            try:
                return e.code, json.loads(e.read() or b"{}")
            except ValueError:
                return e.code, {"error": e.reason}

    def _open(self, address: str, path: str, body: dict[str, Any] | None, timeout: float) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url(address, path), data=data,
                                         method="GET" if body is None else "POST",
                                         headers={"Content-Type": "application/json",
                                                  **self.admin_headers(address, path)})
        with urllib.request.urlopen(request, timeout=timeout, context=self._context) as resp:
            return resp.status, json.loads(resp.read())
