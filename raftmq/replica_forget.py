"""``raftmq replica forget --config node.toml``: a stopped replica's data directory made a
new storage of its group (``dledger.raft.storage_identity.forget_storage``).

For a disk that may lack what its replica acknowledged while keeping the identity the
group recorded for it -- a data directory restored from a backup, or one put back after a
resync moved it away: started as it is, it would vote as the storage the group knows
with an older log (issue 24). After ``forget`` it starts as a new joiner (``j-...``),
catches up from the leader and votes only once the leader has recorded it.

It refuses while the replica seems to run: its Raft address or its broker's ``listen``
address answers a TCP connection (stop it first; another process on those ports is
refused too).
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

__all__ = ["forget", "running_on"]

_PROBE_S = 1.0


def _answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_PROBE_S):
            return True
    except (OSError, ValueError):
        return False


def running_on(addresses: dict[str, str]) -> list[str]:
    """The ``what address`` of ``addresses`` (what -> HOST:PORT) that answer a connection."""
    return [f"{what} {address}" for what, address in addresses.items() if _answers(address)]


def node_group_config(path: str) -> Any:
    """The Raft group config of a broker node's TOML (its other sections allowed): what
    ``raftmq replica init`` and ``forget`` act on."""
    from broker.config import SECTIONS
    from dledger.config import load_group_config

    extra = [s for s in SECTIONS if s not in ("node", "group", "raft")]
    return load_group_config(Path(path), insecure=True, other_sections=extra)


def forget(configs: list[str]) -> int:
    """``raftmq replica forget`` for each config; the exit status (1: any refused)."""
    from broker.config import SECTIONS
    from common.toml_config import read_toml
    from dledger.config import ConfigError
    from dledger.raft.storage_identity import StorageIdentityError, forget_storage

    if not configs:
        raise SystemExit("raftmq replica: error: forget needs --config NODE_TOML")
    failed = 0
    for path in configs:
        try:
            config = node_group_config(path)
            addresses = {"its Raft address": config.address}
            listen = read_toml(Path(path), SECTIONS).get("broker", {}).get("listen")
            if isinstance(listen, str) and listen:
                addresses["its broker address"] = listen
            busy = running_on(addresses)
            if busy:
                raise StorageIdentityError(
                    f"{config.node} seems to be running ({', '.join(busy)} answers): stop it first "
                    f"(systemctl stop raftmq-broker); nothing was changed")
            done = forget_storage(config.data_dir)
        except (ConfigError, StorageIdentityError, OSError, ValueError) as e:
            print(f"error: {path}: {e}", file=sys.stderr)
            failed += 1
            continue
        print(f"{config.node} of group {config.group}: {config.data_dir} is now a new storage "
              f"{done.now.token} (was {done.was.token if done.was else 'none'})")
        if done.hard_state_moved_to is not None:
            print(f"  its Raft hard state (term, vote) moved aside to {done.hard_state_moved_to}")
        print("  start it: it catches up from the leader and votes only once recorded (its log "
              "says 'it votes and may stand'; /status shows voter: true)")
    return 1 if failed else 0
