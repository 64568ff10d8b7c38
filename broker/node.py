"""A broker replica process: a ReplicatedLog (the Log) + apply step + WebSocket server.

Usage: ``raftmq broker --config node.toml`` (or ``python -m broker``). The node's
TOML is the group config (``dledger.config``) plus::

    [broker]
    listen = "127.0.0.1:10911"                  # clients' WebSocket and HTTP
    addresses = { n1 = "127.0.0.1:10911", ... }  # every replica's listen address,
                                                 # so NOT_LEADER can name where to go
    index_slots = 5000000                        # IndexFile geometry (RocketMQ's defaults)
    index_entries = 20000000
    namesrv = ["127.0.0.1:9876"]                 # name servers to register with (optional;
                                                 # signed with a key derived from the group's
                                                 # secret: broker/registrar.py)
    max_message_bytes = 4194304                  # largest encoded message accepted (default
                                                 # 4 MiB, at most 64 MiB); a larger one gets
                                                 # MESSAGE_TOO_LARGE. Clients must accept
                                                 # frames of this size plus 64 KiB to pull it.
    delay_levels = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
                                                 # delayed messages' levels (DELAY=1..N)
    retry_delays = "10s 30s 1m ... 2h"           # consumer retries: delay before retry k
                                                 # (the last one repeats); RocketMQ's 16 steps
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from typing import Any

from broker.config import SECTIONS
from broker.node_tls import ServingTls, read_serving
from broker.registrar import Registrar
from broker.remoting.guarded_site import GuardedSite
from broker.remoting.server import AppliedSignal, BrokerServer
from broker.rocketmq.connection import RocketLimits
from broker.rocketmq.front_end import RocketFrontEnd
from broker.state.machine import BrokerStateMachine
from broker.store.format import StoreFormatError, check_store_format
from common.process import run_alone
from dledger.applier import Applier
from dledger.log import Log
from dledger.process.replica_args import add_replica_arguments, open_replica
from protocol.tls import ws_url

__all__ = ["main"]

log = logging.getLogger("broker.node")

def rocket_front_end(server: BrokerServer, listen: str) -> RocketFrontEnd:
    """The RocketMQ port's front end under the client port's ``[broker]`` bounds: its frame
    limit, ``frame_deadline_s``, ``idle_timeout_s`` and its meter of frames still arriving."""
    limits = server.connections.limits
    return RocketFrontEnd(server, listen, RocketLimits(
        max_frame_bytes=server.max_frame_bytes, frame_deadline_s=limits.frame_deadline_s,
        idle_timeout_s=limits.idle_timeout_s, meter=server.connections))


async def _serve(rlog: Log, machine: BrokerStateMachine, applier: Applier,
                 listen: str, addresses: dict[str, str], namesrvs: list[str],
                 tls: ServingTls | None = None, **options: Any) -> None:
    sig = AppliedSignal(asyncio.get_running_loop())
    peer = tls.peer if tls is not None else None
    server = BrokerServer(rlog, machine, applier, sig, lambda name: rlog.client_addresses().get(name),
                          addresses=addresses, peer_tls=peer, **options)
    # on SIGTERM: close the clients' WebSockets at once (they re-route to the next leader)
    # instead of letting aiohttp wait up to 60 s for them while this node still leads
    rocketmq = rocket_front_end(server, listen)  # RocketMQ's clients on the same port (first byte)
    runner = server.runner(access_log=None, shutdown_timeout=1.0,  # behind the connection guard
                           alternate=rocketmq.protocol)
    await runner.setup()
    host, port = listen.rsplit(":", 1)
    await GuardedSite(runner, host, int(port),  # accepts within the descriptor reserve
                      ssl_context=tls.context if tls is not None else None).start()
    registrar = (asyncio.create_task(Registrar(rlog, machine, listen, namesrvs, tls=peer).run())
                 if namesrvs else None)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    log.info("broker %s of group %s serving %s", rlog.config.node, rlog.config.group,
             ws_url(listen, "/ws", tls is not None))
    await stop.wait()
    if rlog.is_leader and len(rlog.members()) > 1:  # hand over first: writes pause briefly
        with contextlib.suppress(Exception):
            await server.transfer_leadership(timeout=3.0)
    if registrar is not None:
        registrar.cancel()
    await server.close_connections()
    rocketmq.close_connections()
    await runner.cleanup()


DESCRIPTION = "Run one broker replica of a RaftMQ group."


def configure(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``raftmq broker`` (also ``python -m broker``)."""
    add_replica_arguments(parser)


def main(argv: list[str] | None = None) -> int:
    return run_alone(argv, "raftmq broker", DESCRIPTION, configure, run)


def run(args: argparse.Namespace) -> int:
    rlog, (broker, tls) = open_replica(args, lambda path: read_serving(path, insecure=args.insecure),
                                       sections=SECTIONS)
    config = rlog.config
    try:
        check_store_format(config.data_dir)
    except (StoreFormatError, OSError) as e:
        rlog.close()
        print(f"error: {e}", file=sys.stderr)
        return 2
    machine = BrokerStateMachine(
        config.data_dir / "store", index_slots=broker.index_slots, index_entries=broker.index_entries,
        cq_units_per_file=broker.cq_units_per_file, segment_bytes=config.segment_bytes,
        digest_every=broker.digest_every, disk=rlog.disk)
    rlog.set_applied_floor(machine.durable_index)  # a restart re-applies from there
    rlog.set_snapshot_source(machine)  # retention cuts only where a snapshot is held
    applier = Applier(rlog, machine).start()
    try:
        asyncio.run(_serve(rlog, machine, applier, broker.listen, dict(broker.addresses),
                           list(broker.namesrv), tls, **broker.server_options()))
    finally:
        applier.stop()
        rlog.close()
        machine.close()
    return 0
