"""A broker replica process: ReplicatedLog + apply step + WebSocket server.

Usage: ``raftmq broker --config node.toml`` (or ``python -m broker``). The node's
TOML is the group config (``dledger.config``) plus::

    [broker]
    listen = "127.0.0.1:10911"                  # clients' WebSocket and HTTP
    addresses = { n1 = "127.0.0.1:10911", ... }  # every replica's listen address,
                                                 # so NOT_LEADER can name where to go
    index_slots = 5000000                        # IndexFile geometry (RocketMQ's defaults)
    index_entries = 20000000
    namesrv = ["127.0.0.1:9876"]                 # name servers to register with (optional)
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
import os
import signal
import tomllib
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from broker.deferred import DEFAULT_DELAY_LEVELS, parse_delay_levels
from broker.index_file import DEFAULT_INDEX_NUM, DEFAULT_SLOT_NUM
from broker.message_format import MAX_MESSAGE_BYTES
from broker.namesrv import REGISTER_EVERY_S
from broker.server import AppliedSignal, BrokerServer
from broker.state_machine import DIGEST_EVERY, BrokerStateMachine
from dledger.applier import Applier
from dledger.config import ConfigError
from dledger.replica_args import add_replica_arguments, open_replica
from dledger.replicated_log import ReplicatedLog

__all__ = ["main"]

log = logging.getLogger("broker.node")

#: Upper bound of ``[broker] max_message_bytes``: a request frame and a message being
#: reassembled from its fragments are held in memory whole.
MAX_MESSAGE_BYTES_LIMIT = 64 * 1024 * 1024

#: TEST ONLY. ``RAFTMQ_TEST_UNSAFE_ACK=1`` in a broker's environment builds the
#: deliberately BROKEN broker of the chaos suite's self-test: sends are acknowledged
#: before a majority commits them (``WritePath.unsafe_ack_before_commit``), so
#: acknowledged messages are lost on failover. Read from the environment only -- no
#: config file, flag or request can set it. Never set it outside that test.
UNSAFE_ACK_ENV = "RAFTMQ_TEST_UNSAFE_ACK"


def _broker_section(path: Path) -> dict[str, Any]:
    doc = tomllib.loads(path.read_text())
    section = doc.get("broker", {})
    if not section.get("listen"):
        raise ConfigError(f"{path}: [broker] listen = \"host:port\" is missing")
    limit = section.get("max_message_bytes", MAX_MESSAGE_BYTES)
    if type(limit) is not int or not 1 <= limit <= MAX_MESSAGE_BYTES_LIMIT:
        raise ConfigError(f"{path}: [broker] max_message_bytes must be an integer in "
                          f"1..{MAX_MESSAGE_BYTES_LIMIT}, not {limit!r}")
    for key in ("delay_levels", "retry_delays"):
        try:
            parse_delay_levels(str(section.get(key, DEFAULT_DELAY_LEVELS)))
        except ValueError as e:
            raise ConfigError(f"{path}: [broker] {key}: {e}") from None
    every = section.get("digest_every", DIGEST_EVERY)
    if type(every) is not int or not 64 <= every <= 10_000_000:
        raise ConfigError(f"{path}: [broker] digest_every (entries between state digests the "
                          f"replicas compare) must be an integer in 64..10000000, not {every!r}")
    overdue = section.get("retry_overdue_s", 15)
    if type(overdue) not in (int, float) or not 1 <= overdue <= 86_400:
        raise ConfigError(f"{path}: [broker] retry_overdue_s must be a number of seconds in 1..86400, "
                          f"not {overdue!r}")
    return section


async def _register_forever(rlog: ReplicatedLog, machine: BrokerStateMachine, listen: str,
                            namesrvs: list[str]) -> None:
    """Tell every name server who we are: every REGISTER_EVERY_S, and at once when the
    role or the topics change."""
    sent: dict[str, Any] | None = None
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        next_at = 0.0
        while True:
            status = rlog.status()
            body = {"group": rlog.config.group, "node": rlog.config.node, "role": status["role"],
                    "term": status["term"], "address": listen, "members": sorted(rlog.members()),
                    "topics": {t: [c.queues, c.perm] for t, c in sorted(machine.topics.items())}}
            loop_time = asyncio.get_running_loop().time()
            if body != sent or loop_time >= next_at:
                delivered = True
                for ns in namesrvs:
                    try:
                        async with session.post(f"http://{ns}/register", json=body) as resp:
                            if resp.status != 200:
                                delivered = False
                                log.warning("name server %s refused registration: %s", ns,
                                            await resp.text())
                    except (aiohttp.ClientError, TimeoutError) as e:
                        delivered = False
                        log.warning("cannot register with name server %s: %s", ns, e)
                # a failed registration is retried on the next poll, not 30 s later
                sent = body if delivered else None
                next_at = loop_time + REGISTER_EVERY_S
            await asyncio.sleep(0.5)  # poll role and topics; registrations are rate-limited


async def _serve(rlog: ReplicatedLog, machine: BrokerStateMachine, applier: Applier,
                 listen: str, addresses: dict[str, str], namesrvs: list[str],
                 **options: Any) -> None:
    sig = AppliedSignal(asyncio.get_running_loop())
    machine.on_applied.append(lambda _index: sig.notify())
    server = BrokerServer(rlog, machine, applier, sig, lambda name: rlog.client_addresses().get(name),
                          addresses=addresses, **options)
    if os.environ.get(UNSAFE_ACK_ENV) == "1":
        log.critical("%s=1: TEST-ONLY BROKEN BUILD -- sends are acknowledged before a majority "
                     "commits them and acknowledged messages WILL be lost on failover", UNSAFE_ACK_ENV)
        server.write.unsafe_ack_before_commit = True
    # on SIGTERM: close the clients' WebSockets at once (they re-route to the next leader)
    # instead of letting aiohttp wait up to 60 s for them while this node still leads
    runner = web.AppRunner(server.app(), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    host, port = listen.rsplit(":", 1)
    await web.TCPSite(runner, host, int(port)).start()
    registrar = asyncio.create_task(_register_forever(rlog, machine, listen, namesrvs)) if namesrvs else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    log.info("broker %s of group %s serving ws://%s/ws", rlog.config.node, rlog.config.group, listen)
    await stop.wait()
    if rlog.is_leader and len(rlog.members()) > 1:  # hand over first: writes pause briefly
        with contextlib.suppress(Exception):
            await server.transfer_leadership(timeout=3.0)
    if registrar is not None:
        registrar.cancel()
    await server.close_connections()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raftmq broker",
                                     description="Run one broker replica of a RaftMQ group.")
    add_replica_arguments(parser)
    rlog, broker = open_replica(parser.parse_args(argv), _broker_section)
    config = rlog.config
    machine = BrokerStateMachine(
        config.data_dir / "store",
        index_slots=int(broker.get("index_slots", DEFAULT_SLOT_NUM)),
        index_entries=int(broker.get("index_entries", DEFAULT_INDEX_NUM)),
        cq_units_per_file=int(broker.get("cq_units_per_file", 300_000)),
        segment_bytes=config.segment_bytes,
        digest_every=int(broker.get("digest_every", DIGEST_EVERY)))
    rlog.set_applied_floor(machine.durable_index)  # a restart re-applies from there
    rlog.set_snapshot_source(machine)  # retention cuts only where a snapshot is held
    applier = Applier(rlog, machine).start()
    try:
        asyncio.run(_serve(rlog, machine, applier, broker["listen"],
                           dict(broker.get("addresses", {})), list(broker.get("namesrv", [])),
                           max_message_bytes=broker.get("max_message_bytes", MAX_MESSAGE_BYTES),
                           **{k: broker[k] for k in ("delay_levels", "retry_delays", "retry_overdue_s")
                              if k in broker}))
    finally:
        applier.stop()
        rlog.close()
        machine.close()
    return 0
