"""A broker's client port serves both protocols (in this process, on loopback): RocketMQ
frames over TCP to the RocketMQ front end, HTTP and the native WebSocket to aiohttp, told
apart by the first byte; a frame over the limit closes the connection."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import aiohttp
import pytest

from broker.remoting.client_limits import ClientLimits
from broker.remoting.guarded_site import GuardedSite
from broker.remoting.server import AppliedSignal, BrokerServer
from broker.rocketmq.front_end import RocketFrontEnd
from broker.security.tls import server_context
from broker.state.machine import BrokerStateMachine
from dledger.applier import Applier
from dledger.config import GroupConfig
from dledger.local_log import LocalLog
from protocol.rocketmq.codes import RequestCode, ResponseCode
from protocol.rocketmq.frame import RemotingFrame, decode_frame, read_length
from protocol.rocketmq.headers import GetMaxOffsetRequestHeader
from raftmq.local_group import free_port
from raftmq.local_tls import LocalCA

pytestmark = pytest.mark.sockets


async def read_frame(reader: asyncio.StreamReader) -> RemotingFrame:
    length = read_length(await reader.readexactly(4), 1 << 20)
    return decode_frame(await reader.readexactly(length))


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_one_port_serves_rocketmq_frames_and_http(tmp_path: Path, tls: bool) -> None:
    """With TLS (a RocketMQ client's ``tls.enable``) the first byte is read after the handshake."""
    ca = LocalCA(tmp_path / "tls").ensure() if tls else None
    server_ssl = server_context(ca.server_tls(), "broker.tls") if ca is not None else None
    client_ssl = ca.client_tls().context() if ca is not None else None

    async def main() -> None:
        rlog = LocalLog(GroupConfig(node="n1", peers={"n1": "127.0.0.1:1"}, data_dir=tmp_path / "log"))
        machine = BrokerStateMachine(tmp_path / "store", index_slots=64, index_entries=4096)
        applier = Applier(rlog, machine).start()
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while not rlog.is_leader:
                assert loop.time() < deadline
                await asyncio.sleep(0.02)
            port = free_port()
            address = f"127.0.0.1:{port}"
            server = BrokerServer(rlog, machine, applier, AppliedSignal(loop), lambda _n: address,
                                  addresses={"n1": address}, max_message_bytes=64 * 1024)
            front = RocketFrontEnd(server, address)
            runner = server.runner(alternate=front.protocol)
            await runner.setup()
            try:
                await GuardedSite(runner, "127.0.0.1", port, ssl_context=server_ssl).start()
                await scenario(address, port)
            finally:
                front.close_connections()
                await server.close_connections()
                await runner.cleanup()
        finally:
            applier.stop()
            rlog.close()
            machine.close()

    async def scenario(address: str, port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ssl)
        try:
            ext = GetMaxOffsetRequestHeader(topic="none-such", queue_id=0).to_ext()[0]
            for opaque in (1, 2):  # two requests on one connection, each answered by its opaque
                writer.write(RemotingFrame(RequestCode.GET_MAX_OFFSET, opaque, 0, None, ext).encode())
            answers = [await asyncio.wait_for(read_frame(reader), 10) for _ in range(2)]
            assert sorted(a.opaque for a in answers) == [1, 2]
            assert {a.code for a in answers} == {ResponseCode.TOPIC_NOT_EXIST}
            writer.write(struct.pack(">i", 1 << 30))  # a frame far over the limit: closed
            assert await asyncio.wait_for(reader.read(), 10) == b""
        finally:
            writer.close()
        url = f"{'https' if tls else 'http'}://{address}/healthz"
        connector = aiohttp.TCPConnector(ssl=client_ssl if client_ssl is not None else True)
        async with aiohttp.ClientSession(connector=connector) as http, http.get(url) as resp:
            assert resp.status == 200 and await resp.text() == "ok"  # the same port still speaks HTTP

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_rocketmq_connection_over_the_connection_cap_is_closed(tmp_path: Path) -> None:
    async def main() -> None:
        rlog = LocalLog(GroupConfig(node="n1", peers={"n1": "127.0.0.1:1"}, data_dir=tmp_path / "log"))
        machine = BrokerStateMachine(tmp_path / "store", index_slots=64, index_entries=4096)
        applier = Applier(rlog, machine).start()
        try:
            loop = asyncio.get_running_loop()
            port = free_port()
            address = f"127.0.0.1:{port}"
            server = BrokerServer(rlog, machine, applier, AppliedSignal(loop), lambda _n: address,
                                  addresses={"n1": address},
                                  limits=ClientLimits(max_connections_per_address=1))
            front = RocketFrontEnd(server, address)
            runner = server.runner(alternate=front.protocol)
            await runner.setup()
            try:
                await GuardedSite(runner, "127.0.0.1", port).start()
                ext = GetMaxOffsetRequestHeader(topic="none-such", queue_id=0).to_ext()[0]
                frame = RemotingFrame(RequestCode.GET_MAX_OFFSET, 1, 0, None, ext).encode()
                first_reader, first = await asyncio.open_connection("127.0.0.1", port)
                first.write(frame)
                assert (await asyncio.wait_for(read_frame(first_reader), 10)).opaque == 1
                second_reader, second = await asyncio.open_connection("127.0.0.1", port)
                second.write(frame)  # one connection per address: the second is closed unanswered
                assert await asyncio.wait_for(second_reader.read(), 10) == b""
                first.write(frame)  # the first still served
                assert (await asyncio.wait_for(read_frame(first_reader), 10)).opaque == 1
                for writer in (first, second):
                    writer.close()
            finally:
                front.close_connections()
                await server.close_connections()
                await runner.cleanup()
        finally:
            applier.stop()
            rlog.close()
            machine.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_rocketmq_frame_counts_against_the_ports_budget_of_frames_arriving(tmp_path: Path) -> None:
    """The connection guard meters a RocketMQ frame's bytes while it arrives, as a WebSocket
    frame's: a frame that takes longer than ``frame_deadline_s`` closes its connection."""
    async def main() -> None:
        rlog = LocalLog(GroupConfig(node="n1", peers={"n1": "127.0.0.1:1"}, data_dir=tmp_path / "log"))
        machine = BrokerStateMachine(tmp_path / "store", index_slots=64, index_entries=4096)
        applier = Applier(rlog, machine).start()
        try:
            loop = asyncio.get_running_loop()
            port = free_port()
            address = f"127.0.0.1:{port}"
            server = BrokerServer(rlog, machine, applier, AppliedSignal(loop), lambda _n: address,
                                  addresses={"n1": address}, limits=ClientLimits(frame_deadline_s=0.5))
            front = RocketFrontEnd(server, address)
            runner = server.runner(alternate=front.protocol)
            await runner.setup()
            try:
                await GuardedSite(runner, "127.0.0.1", port).start()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                ext = GetMaxOffsetRequestHeader(topic="none-such", queue_id=0).to_ext()[0]
                frame = RemotingFrame(RequestCode.GET_MAX_OFFSET, 1, 0, None, ext).encode()
                writer.write(frame)  # a whole frame: answered, nothing left arriving
                assert (await asyncio.wait_for(read_frame(reader), 10)).opaque == 1
                writer.write(frame[:10])  # then part of a frame, never finished: the guard's
                started = loop.time()  # deadline (0.5 s) closes it, long before the front end's own (30 s)
                assert await asyncio.wait_for(reader.read(), 10) == b""
                assert loop.time() - started < 10
                writer.close()
            finally:
                front.close_connections()
                await server.close_connections()
                await runner.cleanup()
        finally:
            applier.stop()
            rlog.close()
            machine.close()

    asyncio.run(asyncio.wait_for(main(), 60))
