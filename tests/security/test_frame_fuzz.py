"""Hypothesis fuzzing of WebSocket frames against a broker (issue 15, build item 5).

Frames of every request code with the classes' own keys and random values, random flags,
msgpack arrays of anything, mutated (flipped, cut, extended) valid frames and plain bytes,
one after the other on one connection. For each, what ``decode_frame`` -- the broker's own
decoder -- says of it fixes what must happen:

    decodes, a request          answered on its opaque, never SYSTEM_ERROR
    decodes, oneway / response  no answer; the connection goes on
    FrameError, answerable      MALFORMED_FRAME / MESSAGE_TOO_LARGE on its opaque
    FrameError, unanswerable    the connection closed with 1007 and a reason

and after each a HEARTBEAT on the same connection (unless closed) must be answered. Nothing
the broker logs at ERROR (a handler failing) is allowed: 0 crashes.

Every example runs twice: against a broker without ACLs, and against one with ACLs on
(``client_auth``), where each fuzzing connection first authenticates as a super user over
the raw socket (SCRAM-SHA-256, ``protocol.acl``) -- a frame the fuzzer draws may also be an
AUTH_START / AUTH_FINISH of its own, which must be answered like any other.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import pytest
import scramp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.store.commands import PutUser
from client.credentials import Credentials, scram_record
from protocol.acl import MECHANISM, AuthFinishRequest, AuthResponse, AuthStartRequest
from protocol.catalog import CATALOG
from protocol.remoting import MAX_OPAQUE, Frame, FrameError, RequestCode, ResponseCode, decode_frame
from raftmq.local_acl import acl_broker_options, local_credentials
from raftmq.local_group import LocalGroup
from tests.support.inprocess_broker import serving_broker
from tests.support.raw_ws import read_frame, send_binary, upgrade

PROBE_OPAQUE = MAX_OPAQUE  # the HEARTBEAT sent after each example (fuzzed opaques avoid it)
ANSWER_S = 10.0

# -- strategies ----------------------------------------------------------------------

ext_scalars = (st.none() | st.booleans() | st.integers(-3, 40) | st.integers(-(2**63), 2**64 - 1)
               | st.text(max_size=12) | st.binary(max_size=12))
ext_values = ext_scalars | st.lists(ext_scalars, max_size=4)
opaques = st.integers(0, MAX_OPAQUE - 1)
flags = st.sampled_from([0, 0, 0, 0, 1, 2])


def _keys(code: RequestCode) -> list[str]:
    request_class = CATALOG[code][0]
    return [f.encode_name for f in msgspec.structs.fields(request_class)]


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """A frame of a known code with (some of) its class's keys holding random values."""
    code = draw(st.sampled_from(sorted(CATALOG)))
    keys = _keys(code)
    ext = draw(st.dictionaries(st.sampled_from(keys) if keys else st.text(max_size=6), ext_values,
                               max_size=len(keys) + 1))
    for key in [k for k in ext if k.lower().startswith("suspend")]:
        ext[key] = draw(st.integers(0, 50))  # a long poll would only make the example slow
    body = draw(st.binary(max_size=200) | st.builds(
        lambda v: msgpack.packb(v, use_bin_type=True), st.lists(st.binary(max_size=40), max_size=3)))
    return Frame(int(code), draw(opaques), draw(flags), "", ext, body).encode()


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=10)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid request frame, flipped, cut or extended."""
    data = bytearray(draw(requests()))
    how = draw(st.sampled_from(["flip", "cut", "extend"]))
    if how == "flip":
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    elif how == "cut":
        del data[draw(st.integers(0, len(data) - 1)):]
    else:
        data += draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


frames_of_all_kinds = st.one_of(
    requests(), mutated(),
    st.builds(lambda fields: msgpack.packb([1, *fields], use_bin_type=True),
              st.lists(msgpack_values, max_size=8)),
    st.builds(lambda v: msgpack.packb(v, use_bin_type=True), msgpack_values),
    st.binary(max_size=64))


# -- the broker and its client ---------------------------------------------------------

FUZZER = Credentials("fuzzer", "a password for the fuzzing only")


@pytest.fixture(scope="module", params=[None, FUZZER], ids=["acl-off", "acl-on"])
def client_auth(request: pytest.FixtureRequest) -> Credentials | None:
    """The credentials every fuzzing connection authenticates with (None: ACLs off)."""
    return request.param


def bootstrap_user(credentials: Credentials) -> PutUser:
    record = scram_record(credentials.password)
    return PutUser(credentials.user, True, record.salt, record.iterations, record.stored_key,
                   record.server_key)


def _call(sock: socket.socket, request: Any, opaque: int) -> Frame:
    send_binary(sock, request.to_frame(opaque).encode())
    while True:
        got = read_frame(sock, ANSWER_S)
        assert got is not None and got[0] == 2, f"no answer to {request!r}: {got!r}"
        frame = decode_frame(got[1])
        if frame.is_response and frame.opaque == opaque:
            return frame


def wait_for_login(address: str, auth: Credentials, timeout: float = 15.0) -> None:
    """Until the leader has proposed the bootstrapped user and it authenticates."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            open_client(address, auth).close()
            return
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def open_client(address: str, auth: Credentials | None) -> socket.socket:
    """A raw WebSocket to ``address``, authenticated as ``auth`` (SCRAM over frames)."""
    sock = upgrade(address)
    if auth is None:
        return sock
    scram = scramp.ScramClient([MECHANISM], auth.user, auth.password)
    first = _call(sock, AuthStartRequest(mechanism=MECHANISM, message=scram.get_client_first()), 1)
    assert first.code == ResponseCode.SUCCESS, first.remark
    scram.set_server_first(AuthResponse.from_frame(first).message)
    final = _call(sock, AuthFinishRequest(message=scram.get_client_final()), 2)
    assert final.code == ResponseCode.SUCCESS, final.remark
    scram.set_server_final(AuthResponse.from_frame(final).message)
    return sock


class Errors(logging.Handler):
    """ERROR records of the broker's loggers (a handler that failed) and of asyncio's (a task
    of the broker's that failed unseen)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(("broker", "asyncio")):
            self.records.append(record)


@pytest.fixture(scope="module")
def inprocess(tmp_path_factory: pytest.TempPathFactory,
              client_auth: Credentials | None) -> Iterator[tuple[str, Errors]]:
    """A broker on a LocalLog on its own event loop thread, with ACLs on when ``client_auth``
    is given (its super user bootstrapped): (address, its ERROR records)."""
    acl: dict[str, Any] = {} if client_auth is None else {
        "acl": True, "acl_bootstrap": bootstrap_user(client_auth)}
    errors = Errors()
    logging.getLogger().addHandler(errors)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    address: Future[str] = Future()
    stop = asyncio.Event()

    async def serve() -> None:
        async with serving_broker(tmp_path_factory.mktemp("fuzz"), **acl) as (_server, at):
            address.set_result(at)
            await stop.wait()

    served = asyncio.run_coroutine_threadsafe(serve(), loop)
    try:
        at = address.result(15)
        if client_auth is not None:
            wait_for_login(at, client_auth)
        yield at, errors
    finally:
        loop.call_soon_threadsafe(stop.set)
        served.result(15)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        logging.getLogger().removeHandler(errors)


# -- the property --------------------------------------------------------------------

class Session:
    """One fuzzing connection, reopened after the broker closed it."""

    def __init__(self, address: str, auth: Any) -> None:
        self.address, self.auth = address, auth
        self.sock: socket.socket | None = None

    def check(self, data: bytes) -> None:
        """Send ``data``; assert the broker did what ``decode_frame`` says it must (module
        docstring)."""
        if self.sock is None:
            self.sock = open_client(self.address, self.auth)
        expect_answer, expect_close = _expectation(data)
        send_binary(self.sock, data)
        if not expect_close:
            send_binary(self.sock, Frame.request(RequestCode.HEARTBEAT, PROBE_OPAQUE).encode())
        answers: dict[int, Frame] = {}
        while True:
            got = read_frame(self.sock, ANSWER_S)
            assert got is not None, f"neither an answer nor a close within {ANSWER_S} s for {data[:80]!r}"
            opcode, payload = got
            if opcode == 8:
                code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else None
                self.sock.close()
                self.sock = None
                assert expect_close, f"closed ({code} {payload[2:]!r}) after an answerable {data[:80]!r}"
                assert code == 1007 and payload[2:], f"closed with {code} {payload[2:]!r}"
                return
            if opcode != 2:
                continue
            frame = decode_frame(payload)
            if not frame.is_response:
                continue  # a request of the broker's own (a consumer-list notice)
            assert not expect_close, f"answered {frame} to a frame with no readable opaque: {data[:80]!r}"
            assert frame.code != ResponseCode.SYSTEM_ERROR, f"failed on {data[:80]!r}: {frame.remark}"
            answers[frame.opaque] = frame
            if PROBE_OPAQUE in answers and (expect_answer is None or expect_answer in answers):
                return


def _expectation(data: bytes) -> tuple[int | None, bool]:
    """(the opaque an answer must carry or None, whether the connection must be closed)."""
    try:
        frame = decode_frame(data)
    except FrameError as e:
        reply = e.response()
        return (None, True) if reply is None else (reply.opaque, False)
    if frame.flags or frame.opaque == PROBE_OPAQUE:
        return None, False
    return frame.opaque, False


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          database=None)
@given(data=st.data())
def test_every_frame_is_answered_or_closed_with_a_reason(inprocess: tuple[str, Errors],
                                                        client_auth: Any, data: st.DataObject) -> None:
    address, errors = inprocess
    session = _sessions.setdefault((address, repr(client_auth)), Session(address, client_auth))
    session.check(data.draw(frames_of_all_kinds))
    assert not errors.records, [f"{r.getMessage()} {r.exc_info}" for r in errors.records]


_sessions: dict[tuple[str, str], Session] = {}


@pytest.mark.cluster
@pytest.mark.parametrize("acl", [False, True], ids=["acl-off", "acl-on"])
def test_a_broker_process_survives_the_fuzzing(tmp_path: Path, acl: bool) -> None:
    options: dict[str, Any] = {"index_slots": 4096, "index_entries": 65536}
    if acl:
        options.update(acl_broker_options(tmp_path))
    group = LocalGroup(tmp_path / "g", 1, module="broker", broker=options)
    try:
        group.start()
        name = group.wait_leader(timeout=30)
        auth = local_credentials(tmp_path) if acl else None
        if auth is not None:
            wait_for_login(group.nodes[name].http, auth, timeout=30)
        session = Session(group.nodes[name].http, auth)

        @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                  database=None)
        @given(frame=frames_of_all_kinds)
        def fuzz(frame: bytes) -> None:
            session.check(frame)

        fuzz()
        assert group.nodes[name].alive
        log = group.log_tail(name, 100_000)
        assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    finally:
        group.stop()
