"""ACLs for a local cluster (``raftmq cluster up --acl``, ``raftmq bench --local --acl``):
a super user ``admin`` with a random password, its SCRAM record the groups bootstrap from.

    D/admin.credentials   two lines, "admin" and the password (mode 0600): give it to the
                          client commands as RAFTMQ_CREDENTIALS_FILE or --credentials-file
    D/admin.scram         the super user's SCRAM record ([broker] acl_bootstrap_file)
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

from client.credentials import Credentials, scram_record
from protocol.tls import ClientTls

__all__ = ["SUPER_USER", "acl_broker_options", "local_credentials", "wait_for_super_user"]

SUPER_USER = "admin"


def acl_broker_options(root: Path) -> dict[str, Any]:
    """The [broker] settings of a group under ``root/<group>/`` with ACLs on; writes the
    credentials and the record under ``root`` the first time."""
    creds, record_path = root / "admin.credentials", root / "admin.scram"
    if not creds.exists():
        password = secrets.token_urlsafe(18)
        creds.touch(mode=0o600)
        creds.write_text(f"{SUPER_USER}\n{password}\n")
        record = scram_record(password)
        record_path.write_text(json.dumps({
            "user": SUPER_USER, "salt": record.salt.hex(), "iterations": record.iterations,
            "stored_key": record.stored_key.hex(), "server_key": record.server_key.hex()}))
        record_path.chmod(0o600)
    return {"acl": True, "acl_bootstrap_file": str(record_path.resolve())}


def local_credentials(root: Path) -> Credentials | None:
    """The super user's credentials of a local cluster started with ACLs (None: without)."""
    path = root / "admin.credentials"
    return Credentials.from_file(path) if path.exists() else None


def wait_for_super_user(namesrv: str, root: Path, tls: ClientTls | bool = False,
                        timeout: float = 30.0) -> None:
    """Return once the local super user can authenticate (the leaders propose it within a
    second of being elected); TimeoutError otherwise. ``tls``: the client's (``ClientTls``)."""
    import time

    from client import Admin
    from client.errors import ClientError

    credentials = local_credentials(root)
    deadline = time.monotonic() + timeout
    admin = Admin(namesrv, credentials=credentials, tls=tls)
    try:
        while True:
            try:
                admin.topics()
                return
            except ClientError as e:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the super user cannot authenticate after {timeout:.0f} s: "
                                       f"{e}") from e
            time.sleep(0.2)
    finally:
        admin.close()
