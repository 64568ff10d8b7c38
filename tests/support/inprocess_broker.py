"""A one-replica broker served in this process, on the running event loop (no Raft socket).

``serving_broker(base, **server_kw)`` is an async context manager: a ``LocalLog`` with the
broker's apply step and a ``BrokerServer`` on 127.0.0.1 behind it; it yields the server and
its client address and tears everything down on exit, also on failure.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from broker.remoting.guarded_site import GuardedSite
from broker.remoting.server import AppliedSignal, BrokerServer
from broker.state.machine import BrokerStateMachine
from dledger.applier import Applier
from dledger.config import GroupConfig
from dledger.local_log import LocalLog
from raftmq.local_group import free_port

__all__ = ["serving_broker"]


@contextlib.asynccontextmanager
async def serving_broker(base: Path, **server_kw: Any) -> AsyncIterator[tuple[BrokerServer, str]]:
    rlog = LocalLog(GroupConfig(node="n1", peers={"n1": "127.0.0.1:1"}, data_dir=base / "log"))
    machine = BrokerStateMachine(base / "store", index_slots=64, index_entries=4096)
    applier = Applier(rlog, machine).start()
    loop = asyncio.get_running_loop()
    try:
        deadline = loop.time() + 10
        while not rlog.is_leader:
            assert loop.time() < deadline, "a one-node group elected no leader in 10 s"
            await asyncio.sleep(0.02)
        port = free_port()
        address = f"127.0.0.1:{port}"
        server = BrokerServer(rlog, machine, applier, AppliedSignal(loop), lambda _name: address,
                              addresses={"n1": address}, **server_kw)
        runner = server.runner()
        await runner.setup()
        try:
            await GuardedSite(runner, "127.0.0.1", port).start()
            yield server, address
        finally:
            await server.close_connections()
            await runner.cleanup()
    finally:
        applier.stop()
        rlog.close()
        machine.close()
