"""A stand-alone replica of the CommitLog with a small HTTP control API.

Runs one ``ReplicatedLog`` with the ``RecordingMachine`` as its state machine.
The multi-process tests, ``scripts/bench-log`` and operators use it to drive
and inspect a group without the broker on top:

    POST /propose            body = payload  -> 200 {"index","term","position"}
                                                421 not leader {"leader","leader_address"}
                                                503 no leader, 409 outcome unknown,
                                                413 too large
    GET  /status                             -> JSON (role, term, leader, indexes...)
    GET  /stages                             -> JSON {stage: {"buckets": [[le, count]], "sum"}}
                                                (dledger.stage_clock)
    GET  /entries?from=N&max_bytes=M         -> msgpack [[index, term, kind, position, body]]
                                                committed entries only
    GET  /healthz                            -> 200 "ok"

Usage: ``python -m dledger --config node.toml --http 127.0.0.1:8101``
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import signal
import sys

import msgpack
from aiohttp import web

from common.process import control_app, run_alone
from dledger.applier import Applier
from dledger.errors import EntryTooLarge, NoLeader, NotLeader, OutcomeUnknown, ProposeError
from dledger.process.recording_machine import RecordingMachine
from dledger.process.replica_args import add_replica_arguments, open_replica
from dledger.raft.replicated_log import ReplicatedLog

__all__ = ["main"]

log = logging.getLogger("dledger.log_node")

PROPOSE_TIMEOUT_S = 10.0


def _error(status: int, code: str, message: str, **extra: object) -> web.Response:
    return web.json_response({"error": code, "message": message, **extra}, status=status)


def make_app(rlog: ReplicatedLog, applier: Applier) -> web.Application:
    stages = rlog.stages

    async def propose(request: web.Request) -> web.Response:
        payload = await request.read()
        try:
            read = stages.clock()
            future = rlog.propose(payload)
            stages.observe("receive", stages.clock() - read)
            answered: list[float] = []
            future.add_done_callback(lambda _: answered.append(stages.clock()))
            appended = await asyncio.wait_for(asyncio.wrap_future(future), PROPOSE_TIMEOUT_S)
            stages.observe("answer", stages.clock() - answered[0])
        except EntryTooLarge as e:
            return _error(413, "too_large", str(e))
        except NotLeader as e:
            return _error(421, "not_leader", str(e), leader=e.leader,
                          leader_address=e.leader_address)
        except NoLeader as e:
            return _error(503, "no_leader", str(e))
        except (OutcomeUnknown, TimeoutError) as e:
            return _error(409, "outcome_unknown", str(e) or "timed out waiting for commit")
        except ProposeError as e:
            return _error(503, "rejected", str(e))
        return web.json_response(
            {"index": appended.index, "term": appended.term, "position": appended.position})

    async def status(request: web.Request) -> web.Response:
        s = rlog.status().to_json()
        s["applied_index"] = applier.applied_index
        return web.json_response(s)

    async def entries(request: web.Request) -> web.Response:
        try:
            start = int(request.query.get("from", "1"))
            max_bytes = min(int(request.query.get("max_bytes", str(1 << 20))), 16 << 20)
        except ValueError:
            return _error(400, "bad_request", "from and max_bytes must be integers")
        rows = [[e.index, e.term, int(e.kind), e.position, e.body]
                for e in rlog.read(start, max_bytes)]
        return web.Response(body=msgpack.packb(rows), content_type="application/x-msgpack")

    async def stage_times(request: web.Request) -> web.Response:
        return web.json_response({stage: {"buckets": h.snapshot()[0], "sum": h.snapshot()[1]}
                                  for stage, h in stages.histograms.items()})

    return control_app([web.post("/propose", propose), web.get("/status", status),
                        web.get("/entries", entries), web.get("/stages", stage_times)])


async def _serve(rlog: ReplicatedLog, applier: Applier, http: str) -> None:
    host, port = http.rsplit(":", 1)
    runner = web.AppRunner(make_app(rlog, applier), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, int(port)).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("log node %s serving http://%s", rlog.config.node, http)
    await stop.wait()
    await runner.cleanup()


DESCRIPTION = "Run one replica of a RaftMQ CommitLog group with an HTTP control API."


def configure(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``python -m dledger`` (also ``raftmq log-node``)."""
    parser.add_argument("--http", required=True, help="HOST:PORT of the control API")
    add_replica_arguments(parser)


def main(argv: list[str] | None = None) -> int:
    return run_alone(argv, "python -m dledger", DESCRIPTION, configure, run)


def _loopback_literal(host: str) -> bool:
    """Whether ``host`` is a loopback address or ``localhost`` (a name is not resolved: the
    control API has no authentication, so anything else is refused)."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    host = args.http.rpartition(":")[0]
    if not _loopback_literal(host) and not args.insecure:
        print(f"error: the log node's control API (--http {args.http}) has no authentication: "
              "it listens on a loopback address only (127.0.0.1, ::1, localhost); "
              "--insecure overrides this for a throw-away test", file=sys.stderr)
        return 2
    rlog, _ = open_replica(args)
    if not _loopback_literal(host):
        log.warning("INSECURE (--insecure): the log node's control API listens on %s without "
                    "authentication: anyone who reaches it can propose entries and read the log", args.http)
    config = rlog.config
    machine = RecordingMachine(config.data_dir / "applied.log")
    applier = Applier(rlog, machine).start()
    try:
        asyncio.run(_serve(rlog, applier, args.http))
    finally:
        applier.stop()
        rlog.close()
        machine.close()
    return 0
