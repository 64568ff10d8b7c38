"""The client port's bounds as units: descriptors, connection caps, frames still arriving,
parked pulls by queue, requests in flight (broker/remoting/connection_guard.py,
broker/processors/long_polls.py, broker/remoting/frame_reader.py)."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from broker.processors.long_polls import AppliedSignal, ParkedPulls
from broker.remoting.client_limits import ClientLimits
from broker.remoting.connection_guard import CONTROL_FRAME_OVERHEAD, ConnectionGuard, FdBudget
from protocol.message_format import Message, encode_message
from protocol.remoting import FrameError, RequestCode, ResponseCode
from tests.support.broker_client import FrameClient
from tests.support.inprocess_broker import serving_broker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeTransport:
    def __init__(self, host: str) -> None:
        self.host = host
        self.closed = False

    def get_extra_info(self, name: str) -> Any:
        return (self.host, 40000) if name == "peername" else None

    def close(self) -> None:
        self.closed = True


class FakeProtocol:
    def __init__(self) -> None:
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


class Everything:
    """An FdBudget that always has room."""

    def room(self) -> bool:
        return True

    def took(self) -> None:
        pass


def guard(clock: Clock, **limits: Any) -> ConnectionGuard:
    return ConnectionGuard(ClientLimits(**limits), clock=clock, fds=Everything())  # type: ignore[arg-type]


# -- descriptors -------------------------------------------------------------------------

def test_the_descriptor_budget_keeps_the_reserve_and_counts_what_it_let_in() -> None:
    clock, open_now = Clock(), [100]
    budget = FdBudget(20, sample_s=1.0, clock=clock, count_open=lambda: open_now[0], limit=lambda: 130)
    taken = 0
    while budget.room():
        budget.took()
        taken += 1
    assert taken == 10  # 100 open + 10 taken + 20 reserved: the limit of 130
    open_now[0] = 50  # connections closed meanwhile: seen at the next count
    assert not budget.room()
    clock.now += 1.0
    assert budget.room()


def test_no_descriptor_left_to_count_with_means_no_room(monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.remoting import connection_guard

    def listdir(_path: str) -> list[str]:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(connection_guard.os, "listdir", listdir)
    assert not FdBudget(10, limit=lambda: 100).room()


# -- connections -------------------------------------------------------------------------

def test_connections_over_a_cap_are_refused_with_the_reason_and_counted_out() -> None:
    g = guard(Clock(), max_connections=3, max_connections_per_address=2)
    links = [g.admit(FakeTransport("10.0.0.1"), FakeProtocol()) for _ in range(3)]  # type: ignore[arg-type]
    assert [link.refused is None for link in links] == [True, True, False]
    assert "too many connections from 10.0.0.1: 2 open, at most 2 per address" in (links[2].refused or "")
    other = g.admit(FakeTransport("10.0.0.2"), FakeProtocol())  # type: ignore[arg-type]
    third = g.admit(FakeTransport("10.0.0.3"), FakeProtocol())  # type: ignore[arg-type]
    assert other.refused is None and "too many connections to this broker" in (third.refused or "")
    g.release(links[0])
    g.release(links[2])  # a refused one was never counted in
    assert g.open_connections == 2
    assert g.admit(FakeTransport("10.0.0.1"), FakeProtocol()).refused is None  # type: ignore[arg-type]


# -- frames still arriving ---------------------------------------------------------------

class Killed:
    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []

    def __call__(self, code: int, reason: str) -> None:
        self.calls.append((code, reason))


def upgraded(g: ConnectionGuard, host: str = "10.0.0.1") -> tuple[Any, FakeTransport, FakeProtocol, Killed]:
    transport, protocol, killed = FakeTransport(host), FakeProtocol(), Killed()
    link = g.admit(transport, protocol)  # type: ignore[arg-type]
    g.watch(transport, object(), killed)  # type: ignore[arg-type]
    return link, transport, protocol, killed


def test_a_frame_past_its_deadline_is_closed_with_1008_and_the_reason() -> None:
    clock = Clock()
    g = guard(clock, frame_deadline_s=5, idle_timeout_s=10)
    link, _, _, killed = upgraded(g)
    g.received(link, 1000)
    clock.now += 4
    g.received(link, 1000)  # still the same frame: its deadline runs from its first byte
    g.sweep()
    assert not killed.calls
    clock.now += 1.5
    g.sweep()
    assert killed.calls == [(1008, "a frame took longer than 5 s to arrive (2000 bytes of it came); "
                                   "send each frame at once")]
    assert not g.received(link, 10)  # what it sends while closing is dropped
    g.sweep()
    assert len(killed.calls) == 1


def test_whole_frames_and_pings_reset_the_deadline() -> None:
    clock = Clock()
    g = guard(clock, frame_deadline_s=5, idle_timeout_s=10)
    link, transport, _, killed = upgraded(g)
    for _ in range(10):
        g.received(link, 300)
        clock.now += 2
        g.frame_done(transport)
    g.received(link, CONTROL_FRAME_OVERHEAD + 4)  # a ping of 4 bytes
    clock.now += 2
    g.frame_done(transport, control_payload=4)
    clock.now += 10
    g.sweep()
    assert not killed.calls and link.partial == 0


def test_a_ping_inside_a_frame_does_not_reset_its_deadline() -> None:
    clock = Clock()
    g = guard(clock, frame_deadline_s=5, idle_timeout_s=10)
    link, transport, _, killed = upgraded(g)
    g.received(link, 4000)  # a fragment of a message
    g.received(link, CONTROL_FRAME_OVERHEAD)  # an empty ping between fragments
    g.frame_done(transport, control_payload=0)
    assert link.partial == 4000
    clock.now += 6
    g.sweep()
    assert killed.calls and killed.calls[0][0] == 1008


def test_frames_still_arriving_beyond_the_budget_pause_reading_until_others_complete() -> None:
    g = guard(Clock(), max_partial_frame_bytes=10_000)
    a, ta, pa, _ = upgraded(g, "10.0.0.1")
    b, _, pb, _ = upgraded(g, "10.0.0.2")
    g.received(a, 8000)
    g.received(b, 4000)  # over the budget: b brought it there
    assert pb.paused and not pa.paused
    g.frame_done(ta)  # a's frame is whole: room again
    assert not pb.paused
    g.received(b, 7000)
    assert pb.paused
    g.release(b)
    assert g.received(a, 10) and not pa.paused


# -- parked pulls ------------------------------------------------------------------------

def test_parked_pulls_are_capped_per_connection_and_in_all() -> None:
    parked = ParkedPulls(per_connection=2, total=3)
    with parked.slot("a"), parked.slot("a"):
        with pytest.raises(FrameError, match="2 pulls are parked on this connection") as busy:
            parked.slot("a").__enter__()
        assert busy.value.code == ResponseCode.SYSTEM_BUSY
        with parked.slot("b"), pytest.raises(FrameError, match="3 pulls are parked on this broker"):
            parked.slot("c").__enter__()
    assert parked.count == 0
    with parked.slot("a"), parked.slot("a"):
        pass


def test_a_parked_pull_wakes_only_for_its_queue() -> None:
    async def main() -> None:
        signal = AppliedSignal(asyncio.get_running_loop())
        woke: list[str] = []

        async def park(name: str, key: tuple[str, int]) -> None:
            await signal.wait(key, 5)
            woke.append(name)

        tasks = [asyncio.create_task(park("a0", ("a", 0))), asyncio.create_task(park("a1", ("a", 1)))]
        await asyncio.sleep(0.01)
        assert signal.parked() == 2
        signal.notify([("b", 0), ("a", 1)])
        await asyncio.sleep(0.05)
        assert woke == ["a1"]
        signal.notify([("a", 0)])
        await asyncio.gather(*tasks)
        assert woke == ["a1", "a0"] and signal.parked() == 0

    asyncio.run(main())


# -- requests in flight ------------------------------------------------------------------

@pytest.mark.sockets
def test_a_connection_at_its_in_flight_bound_is_not_read_until_a_request_completes(tmp_path: Path) -> None:
    async def main() -> None:
        async with serving_broker(tmp_path, limits=ClientLimits(max_inflight_bytes=4096)) as (
                _server, address), aiohttp.ClientSession() as http:
            c = await FrameClient.connect(http, address)
            r = await c.call(RequestCode.CREATE_TOPIC, {"topic": "t", "queues": 1})
            assert r.code == ResponseCode.SUCCESS
            pulls = [asyncio.create_task(c.call(RequestCode.PULL_MESSAGE, {
                "topic": "t", "queueId": 0, "offset": 0, "suspendMs": 10_000})) for _ in range(4)]
            await asyncio.sleep(0.2)  # four parked pulls hold the 4 KiB (1 KiB each at least)
            heartbeat = asyncio.create_task(c.call(RequestCode.HEARTBEAT))
            await asyncio.sleep(0.5)
            assert not heartbeat.done(), "a frame past the in-flight bound was read"
            other = await FrameClient.connect(http, address)  # the bound is per connection
            sent = await other.call(RequestCode.SEND_MESSAGE, body=encode_message(Message("t", b"x", 0)))
            assert sent.code == ResponseCode.SUCCESS
            assert (await asyncio.wait_for(heartbeat, 5)).code == ResponseCode.SUCCESS
            assert {p.result().code for p in await asyncio.wait_for(_all(pulls), 5)} == {ResponseCode.SUCCESS}
            await other.close()
            await c.close()

    asyncio.run(main())


async def _all(tasks: list[asyncio.Task[Any]]) -> list[asyncio.Task[Any]]:
    await asyncio.gather(*tasks)
    return tasks


@pytest.mark.sockets
def test_the_accept_loop_survives_a_connection_aborted_before_accept_and_a_transient_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """accept(2) may fail for one connection (ECONNABORTED: the peer gave up in the backlog;
    EPROTO, EPERM by a firewall): the client port goes on serving, as asyncio's own server
    does, instead of its accept loop ending silently."""
    from aiohttp import web

    from broker.remoting import guarded_site
    from raftmq.local_group import free_port

    monkeypatch.setattr(guarded_site, "ACCEPT_RETRY_S", 0.01)

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/ok", lambda _r: web.Response(text="ok"))
        runner = guarded_site.GuardedRunner(app, guard(Clock()))
        await runner.setup()
        loop = asyncio.get_running_loop()
        real_accept = loop.sock_accept
        failures = [ConnectionAbortedError(errno.ECONNABORTED, "Software caused connection abort"),
                    OSError(errno.EPROTO, "Protocol error")]

        async def flaky_accept(sock: Any) -> Any:
            if failures:
                raise failures.pop(0)
            return await real_accept(sock)

        monkeypatch.setattr(loop, "sock_accept", flaky_accept)
        port = free_port()
        await guarded_site.GuardedSite(runner, "127.0.0.1", port).start()
        try:
            async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/ok",
                                timeout=aiohttp.ClientTimeout(total=5)) as resp:
                assert resp.status == 200 and not failures
        finally:
            await runner.cleanup()

    asyncio.run(main())
