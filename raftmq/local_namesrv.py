"""A local name server's configuration for local groups (``raftmq cluster up``, tests).

Each group's registration key is derived from the secret its ``LocalGroup`` generated and
written next to the name server's TOML::

    root/namesrv.toml          [namesrv] listen, [groups.gN] key_file = "gN.namesrv-key"
    root/g1.namesrv-key        g1's registration key (mode 0600)
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from broker.namesrv.config import write_namesrv_config
from broker.namesrv.server import write_key_file
from broker.security.registration_auth import registration_key
from broker.security.tls import TlsSection
from raftmq.local_group import LocalGroup

__all__ = ["configure_namesrv", "namesrv_argv"]


def configure_namesrv(root: Path, listen: str, groups: Iterable[LocalGroup],
                      tls: TlsSection | None = None) -> Path:
    """Write the key of every group in ``groups`` and ``root/namesrv.toml`` serving them on
    ``listen`` (with ``tls``: over https); the path of that file."""
    key_files: dict[str, Path] = {}
    for group in groups:
        secret = (group.base / "secret").read_text().strip()
        key_path = root / f"{group.group}.namesrv-key"
        write_key_file(key_path, registration_key(secret, group.group).hex())
        key_files[group.group] = Path(key_path.name)
    return write_namesrv_config(root / "namesrv.toml", listen, key_files, tls)


def namesrv_argv(config: Path) -> list[str]:
    """The command that runs a name server with ``config``."""
    return [sys.executable, "-m", "broker.namesrv.server", "--config", str(config)]
