"""Fixtures shared by the unit tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.state_machine import BrokerStateMachine
from dledger.applier import Applier
from dledger.config import GroupConfig
from dledger.local_group import free_port
from dledger.replicated_log import ReplicatedLog


@pytest.fixture
def one_node_broker(tmp_path: Path) -> Iterator[tuple[ReplicatedLog, BrokerStateMachine, Applier]]:
    """A one-replica group (leader once yielded) with the broker's apply step behind it."""
    rlog = ReplicatedLog(GroupConfig(node="n1", peers={"n1": f"127.0.0.1:{free_port()}"},
                                     data_dir=tmp_path / "log"))
    machine = BrokerStateMachine(tmp_path / "store", index_slots=64, index_entries=4096)
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
