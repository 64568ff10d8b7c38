# A recording TCP proxy for RocketMQ remoting conversations (tests/compat/golden/captured).
#
# Each route listens on 127.0.0.1:LISTEN and forwards to TARGET; both directions are cut
# into remoting frames and every frame is written, in arrival order, as one line:
#
#     <route> <conn> <dir> <hex of the whole frame, length prefix included>
#
# dir is ">" (client to server) or "<" (server to client); conn numbers a route's
# connections from 1. Before each frame a "#" line says what it is (code, flag, opaque,
# serialization, header and body sizes; a JSON header in full). A remoting frame is
#
#     | total length (4, BE) | serialization type (1) + header length (3, BE) | header | body |
#
# where total length counts everything after itself. `rewrite` replaces equal-length byte
# strings in server->client frames AFTER they are recorded: the reference broker advertises
# its own port in routes, and the proxy swaps in its own listening port there so the client's
# broker traffic comes through it too (the recorded bytes are the server's, unchanged).
#
#   python -m tests.compat.recording_proxy --out F.hex \
#       --route ns=29876=127.0.0.1:19876 --route broker=20921=127.0.0.1:20911 \
#       --rewrite 127.0.0.1:20911=127.0.0.1:20921
from __future__ import annotations

import argparse
import asyncio
import json
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

_FLAG_RESPONSE = 0x1
_FLAG_ONEWAY = 0x2


@dataclass(frozen=True)
class Route:
    name: str
    listen_port: int
    target_host: str
    target_port: int


def describe(frame: bytes) -> str:
    """A one-line summary of a frame for the capture's comment lines (never raises)."""
    try:
        (mark,) = struct.unpack_from(">I", frame, 4)
        ser, header_len = mark >> 24, mark & 0xFFFFFF
        header = frame[8 : 8 + header_len]
        body_len = len(frame) - 8 - header_len
        if ser == 0:
            h = json.loads(header)
            kind = "response" if h.get("flag", 0) & _FLAG_RESPONSE else "request"
            return (
                f"JSON {kind} code={h.get('code')} flag={h.get('flag')} opaque={h.get('opaque')} "
                f"header={header_len}B body={body_len}B {header.decode('utf-8', 'replace')}"
            )
        code, lang, version, opaque, flag = struct.unpack_from(">hBhii", header, 0)
        kind = "response" if flag & _FLAG_RESPONSE else "request"
        return (
            f"ROCKETMQ {kind} code={code} lang={lang} version={version} opaque={opaque} "
            f"flag={flag} header={header_len}B body={body_len}B"
        )
    except (ValueError, struct.error, UnicodeDecodeError):
        return f"undecodable frame of {len(frame)}B"


@dataclass
class Recorder:
    """Writes frames of every route to one file, in the order they arrive (thread-safe)."""

    out: TextIO
    lock: threading.Lock = field(default_factory=threading.Lock)
    frames: int = 0

    def record(self, route: str, conn: int, direction: str, frame: bytes) -> None:
        with self.lock:
            self.out.write(f"# {route} {conn} {direction} {describe(frame)}\n")
            self.out.write(f"{route} {conn} {direction} {frame.hex()}\n")
            self.out.flush()
            self.frames += 1


async def _read_frame(reader: asyncio.StreamReader) -> bytes | None:
    try:
        prefix = await reader.readexactly(4)
    except asyncio.IncompleteReadError:
        return None
    (length,) = struct.unpack(">I", prefix)
    try:
        return prefix + await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        return None


def _rewriter(pairs: dict[bytes, bytes]) -> Callable[[bytes], bytes]:
    for old, new in pairs.items():
        if len(old) != len(new):
            raise ValueError(f"rewrite {old!r} -> {new!r} changes the length")

    def rewrite(frame: bytes) -> bytes:
        for old, new in pairs.items():
            frame = frame.replace(old, new)
        return frame

    return rewrite


class RecordingProxy:
    """The proxy's routes served by an asyncio loop on a thread of its own.

    start() returns once every route listens; stop() closes listeners and connections and
    joins the thread. The recorder's file belongs to the caller.
    """

    def __init__(self, routes: list[Route], recorder: Recorder, rewrite: dict[bytes, bytes]) -> None:
        self._routes = routes
        self._recorder = recorder
        self._rewrite = _rewriter(rewrite)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="recording-proxy", daemon=True)
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._conns: dict[str, int] = {}

    def start(self) -> RecordingProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _listen(self) -> None:
        for route in self._routes:
            server = await asyncio.start_server(
                lambda r, w, route=route: self._serve(route, r, w), "127.0.0.1", route.listen_port
            )
            self._servers.append(server)

    async def _close(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(
        self, route: Route, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter
    ) -> None:
        conn = self._conns[route.name] = self._conns.get(route.name, 0) + 1
        try:
            sreader, swriter = await asyncio.open_connection(route.target_host, route.target_port)
        except OSError:
            cwriter.close()
            return
        up = asyncio.create_task(self._pump(route.name, conn, ">", creader, swriter, None))
        down = asyncio.create_task(self._pump(route.name, conn, "<", sreader, cwriter, self._rewrite))
        for t in (up, down):
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)
        await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        for t in (up, down):
            t.cancel()
        for w in (cwriter, swriter):
            w.close()

    async def _pump(
        self,
        route: str,
        conn: int,
        direction: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        rewrite: Callable[[bytes], bytes] | None,
    ) -> None:
        while (frame := await _read_frame(reader)) is not None:
            self._recorder.record(route, conn, direction, frame)
            writer.write(rewrite(frame) if rewrite else frame)
            await writer.drain()


def parse_route(spec: str) -> Route:
    """NAME=LISTEN_PORT=HOST:PORT"""
    name, listen, target = spec.split("=")
    host, port = target.rsplit(":", 1)
    return Route(name, int(listen), host, int(port))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--route", action="append", required=True, type=parse_route)
    ap.add_argument("--rewrite", action="append", default=[])
    args = ap.parse_args()
    rewrite = {old.encode(): new.encode() for old, new in (r.split("=") for r in args.rewrite)}
    with open(args.out, "w") as out:
        proxy = RecordingProxy(args.route, Recorder(out), rewrite).start()
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
        finally:
            proxy.stop()


if __name__ == "__main__":
    main()
