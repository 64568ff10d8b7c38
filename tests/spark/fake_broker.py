"""In-process fake broker replicas for the reader's unit tests: the PULL_MESSAGE and
SEARCH_OFFSET answers of ``broker.remoting.server`` over one queue, plus ``/status`` with a role
-- and knobs to misbehave (a gap, a lag, a crash after some pulls, retention). The queue's
messages are stored in records of ``records_of`` messages; a pull answers whole records as
the broker does (stripes too, unless ``stripes`` is False: a broker that ignores them).

Each replica runs an aiohttp server on its own thread and loop; ``stop()`` ends it.
"""

from __future__ import annotations

import asyncio
import bisect
import threading
import time
from dataclasses import dataclass, field

import msgpack
from aiohttp import WSMsgType, web

from protocol.message_format import Message, encode_message
from protocol.record_batch import decode_messages, encode_record
from protocol.remoting import Frame, RequestCode, ResponseCode, decode_frame
from protocol.tags import tag_hash
from protocol.topic import TopicQueues, TopicsResponse

TOPIC = "t"
QUEUE = 0


def make_messages(n: int, tags: tuple[str | None, ...] = ("a", "b", None)) -> list[tuple[bytes, str | None]]:
    """``n`` encoded messages of queue 0 of topic "t": body b"m<i>", tag cycling through ``tags``."""
    out = []
    for i in range(n):
        tag = tags[i % len(tags)]
        out.append((encode_message(Message(TOPIC, f"m{i}".encode(), QUEUE, tag, (f"k{i}",), {"i": str(i)},
                                           born_ts_ms=1_700_000_000_000 + i)), tag))
    return out


@dataclass
class FakeReplica:
    messages: list[tuple[bytes, str | None]]
    role: str = "follower"
    applied: int | None = None        # the queue's end on this replica (default: all messages)
    min_offset: int = 0
    skip_offset: int | None = None    # leave this offset out of its page (a broken replica)
    die_after_pulls: int | None = None  # close every connection and refuse new ones after this many
    delay_s: float = 0.0              # think time per pull
    error_code: int | None = None     # answer every pull with this code (a broken replica)
    max_pull: int | None = None       # refuse larger pulls as a broker of that limit does
    pulls: int = 0
    searches: int = 0
    rows_served: int = 0
    route: dict[str, object] | None = None  # the GET_ROUTE answer (set by ``link``)
    #: other topics the replica holds for planning (GET_TOPICS, GET_ROUTE, SEARCH_OFFSET; no
    #: pulls): name -> the end offset of their one queue
    topics: dict[str, int] = field(default_factory=dict)
    address: str = ""
    _dead: bool = False
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    records_of: int = 1               # messages per record
    stripes: bool = True              # whether it honours a stripe pull (protocol.pull)
    shipped: list[int] = field(default_factory=list)  # the base offset of every record a pull returned
    _sockets: set[web.WebSocketResponse] = field(default_factory=set)
    _records: list[tuple[int, int, bytes]] = field(default_factory=list)  # (base, count, record)

    def __post_init__(self) -> None:
        for base in range(0, len(self.messages), self.records_of):
            group = [data for data, _ in self.messages[base:base + self.records_of]]
            if len(group) == 1:
                self._records.append((base, 1, group[0]))
                continue
            msgs = [decode_messages(data)[0] for data in group]
            entries = [(m.msg_id, m.born_ts_ms, m.flag, m.tags, m.keys, m.properties, m.reconsume, m.body)
                       for m in msgs]
            self._records.append((base, len(group), encode_record(TOPIC, QUEUE, entries,
                                                                  born_host=msgs[0].born_host)))

    @property
    def end(self) -> int:
        return len(self.messages) if self.applied is None else self.applied

    # -- server ---------------------------------------------------------------------
    def start(self) -> FakeReplica:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application()
            app.add_routes([web.get("/status", self._status), web.get("/ws", self._ws)])
            runner = web.AppRunner(app)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.address = f"127.0.0.1:{port}"
            ready.set()
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        assert ready.wait(10), "fake replica did not start"
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop = None

    def kill(self) -> None:
        """Drop every connection and refuse requests from now on (a dead process)."""
        self._dead = True
        if self._loop is not None:
            for ws in list(self._sockets):
                asyncio.run_coroutine_threadsafe(ws.close(), self._loop)

    async def _status(self, request: web.Request) -> web.Response:
        if self._dead:
            raise web.HTTPServiceUnavailable()
        return web.json_response({"role": self.role})

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        if self._dead:
            raise web.HTTPServiceUnavailable()
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        self._sockets.add(ws)
        try:
            async for msg in ws:
                if msg.type != WSMsgType.BINARY:
                    continue
                frame = decode_frame(msg.data)
                reply = await self._handle(frame)
                if self._dead:
                    await ws.close()
                    break
                await ws.send_bytes(reply.encode())
        finally:
            self._sockets.discard(ws)
        return ws

    async def _handle(self, frame: Frame) -> Frame:
        ext = dict(frame.ext)
        topic = ext.get("topic", TOPIC)
        if frame.code == RequestCode.GET_TOPICS:
            held = {t: TopicQueues(1, 6) for t in sorted({TOPIC, *self.topics})}
            return TopicsResponse(topics=held).reply(frame)
        if frame.code == RequestCode.GET_ROUTE:
            if topic != TOPIC and topic not in self.topics:
                return frame.response(ResponseCode.TOPIC_NOT_EXIST, remark=f"topic {topic!r} does not exist")
            assert self.route is not None
            return frame.response(ResponseCode.SUCCESS, body=msgpack.packb({**self.route, "topic": topic}))
        if frame.code == RequestCode.SEARCH_OFFSET and topic != TOPIC:
            self.searches += 1
            return frame.response(ResponseCode.SUCCESS, ext={"minOffset": 0, "maxOffset": self.topics[topic]})
        if frame.code == RequestCode.SEARCH_OFFSET:
            self.searches += 1
            out: dict[str, int] = {"minOffset": self.min_offset, "maxOffset": self.end}
            if "timestamp" in ext:
                out["offset"] = self.min_offset
            return frame.response(ResponseCode.SUCCESS, ext=out)
        assert frame.code == RequestCode.PULL_MESSAGE, frame.code
        self.pulls += 1
        if self.die_after_pulls is not None and self.pulls > self.die_after_pulls:
            self.kill()
            return frame.response(ResponseCode.SYSTEM_ERROR)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.error_code is not None:
            return frame.response(self.error_code, remark="broken on purpose")
        offset, max_msgs = int(ext["offset"]), int(ext["maxMsgs"])
        if self.max_pull is not None and max_msgs > self.max_pull:
            return frame.response(ResponseCode.INVALID_ARGUMENT,
                                  remark=f"ext field 'maxMsgs': expected `int` <= {self.max_pull}")
        deadline = time.monotonic() + int(ext.get("suspendMs", 0)) / 1000
        while offset >= self.end and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        end = self.end
        if offset >= end:
            code = ResponseCode.PULL_OFFSET_MOVED if offset > end else ResponseCode.PULL_NOT_FOUND
            return frame.response(code, ext={"nextOffset": end if offset > end else offset})
        if offset < self.min_offset:
            return frame.response(ResponseCode.PULL_OFFSET_MOVED, ext={"nextOffset": self.min_offset})
        hashes = ext.get("tagHashes")
        stripe = bool(ext.get("stripe")) and hashes is None and self.stripes
        wanted = None if hashes is None else set(hashes)
        bases = [base for base, _, _ in self._records]
        i = bisect.bisect_right(bases, offset) - 1
        if stripe and bases[i] < offset:
            i += 1  # the record holding the offset: the pull before the stripe has it
        rows: list[list[object]] = []
        got = 0
        next_offset = bases[i - 1] + self._records[i - 1][1] if stripe and i > 0 else offset
        stop = offset + (max_msgs if wanted is None else 4096)
        for base, count, record in self._records[i:]:
            if base >= min(end, stop) or base + count > end:  # a record is applied whole
                break
            next_offset = base + count
            if self.skip_offset is not None and base <= self.skip_offset < base + count:
                continue
            tags = [self.messages[o][1] for o in range(max(base, offset), base + count)]
            if wanted is not None and not any(tag_hash(t) in wanted for t in tags):
                continue
            rows.append([base, 1000 + base, 1_700_000_100_000 + base, record])
            self.shipped.append(base)
            got += len(tags) if wanted is None else sum(tag_hash(t) in wanted for t in tags)
            if got >= max_msgs:
                break
        self.rows_served += sum(min(self._records[bisect.bisect_left(bases, r[0])][1],
                                    r[0] + self._records[bisect.bisect_left(bases, r[0])][1] - offset)
                                for r in rows)  # type: ignore[operator]
        return frame.response(ResponseCode.SUCCESS, body=msgpack.packb(rows),
                              ext={"nextOffset": next_offset, "maxOffset": end})


def link(replicas: dict[str, FakeReplica], group: str = "g1") -> None:
    """Give every replica the route of one group made of them (GET_ROUTE), one queue."""
    leader = next((r.address for r in replicas.values() if r.role == "leader"), None)
    doc = {"topic": TOPIC, "groups": [{"group": group, "queues": 1, "perm": 6, "term": 1, "leader": leader,
                                       "replicas": {n: r.address for n, r in replicas.items()}}]}
    for r in replicas.values():
        r.route = doc
