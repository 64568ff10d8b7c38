"""A one-replica group with the broker's apply step behind it, no Raft socket: a ``LocalLog``
(leader once returned), a ``BrokerStateMachine`` and its ``Applier``; the unit tests'
``one_node_broker`` fixture and the tests that need the group's cluster secret set
(``secret``: access keys are sealed with it)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from broker.state.machine import BrokerStateMachine
from dledger.applier import Applier
from dledger.config import GroupConfig
from dledger.local_log import LocalLog

__all__ = ["one_node_group"]


@contextlib.contextmanager
def one_node_group(base: Path, secret: str | None = None, segment_bytes: int | None = None,
                   ) -> Iterator[tuple[LocalLog, BrokerStateMachine, Applier]]:
    """The group under ``base`` (``log/``, ``store/``), stopped and closed on exit;
    ``segment_bytes``: its CommitLog's segment size (default: the config's)."""
    geometry = {} if segment_bytes is None else {"segment_bytes": segment_bytes}
    rlog = LocalLog(GroupConfig(node="n1", peers={"n1": "127.0.0.1:1"}, data_dir=base / "log", secret=secret,
                                **geometry))  # type: ignore[arg-type]
    machine = BrokerStateMachine(base / "store", index_slots=64, index_entries=4096)
    applier = Applier(rlog, machine).start()
    try:
        deadline = time.monotonic() + 10
        while not rlog.is_leader:
            assert time.monotonic() < deadline, "a one-node group elected no leader in 10 s"
            time.sleep(0.02)
        yield rlog, machine, applier
    finally:
        applier.stop()
        rlog.close()
        machine.close()
