# The reference captures (tests/compat/golden/captured) are whole remoting frames: every
# line's length prefix matches its bytes, its header length fits, requests are answered,
# and each conversation holds the request codes its README row promises.
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
FLAG_RESPONSE = 0x1

# capture -> request codes the README says it holds (RocketMQ RequestCode values)
PROMISED = {
    "producer_send_and_batch": {105, 310, 320, 35},
    "producer_send_rocketmq_serialization": {105, 310, 320},
    "push_consumer_pull_and_commit": {34, 38, 14, 11, 15},
    "ordered_selector_and_orderly_consumer": {41, 42, 310},
    "retry_then_dlq": {36, 30},
    "transaction_commit_rollback_check": {37, 39},
    "sql92_filter": {46},
    "mqadmin_clusterList": {106, 28},
    "mqadmin_topicList": {206},
    "mqadmin_topicStatus": {202},
    "mqadmin_consumerProgress": {208},
    "mqadmin_queryMsgByKey": {12},
    "mqadmin_updateTopic": {17},
    "go_sends_and_push_consumer": {10, 320, 34, 11},
    "go_ordered_sharding_key": {41, 11},
    "go_transaction_check": {37, 39},
}


def capture_path(name: str) -> Path:
    return GOLDEN / ("captured-go" if name.startswith("go_") else "captured") / f"{name}.hex"


def frames(path: Path) -> list[tuple[str, str, bytes]]:
    out = []
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        route, _conn, direction, hexed = line.split(" ")
        out.append((route, direction, bytes.fromhex(hexed)))
    return out


def header_fields(frame: bytes) -> tuple[int, int, int]:
    """(serialization type, code, flag) of a frame."""
    (mark,) = struct.unpack_from(">I", frame, 4)
    ser, header_len = mark >> 24, mark & 0xFFFFFF
    header = frame[8 : 8 + header_len]
    if ser == 0:
        h = json.loads(header)
        return ser, h["code"], h["flag"]
    code, _lang, _version, _opaque, flag = struct.unpack_from(">hBhii", header, 0)
    return ser, code, flag


CAPTURES = sorted(p.stem for p in GOLDEN.glob("captured*/*.hex"))


def test_every_promised_capture_is_there() -> None:
    assert set(PROMISED) <= set(CAPTURES)


@pytest.mark.parametrize("name", CAPTURES)
def test_each_line_is_one_whole_frame(name: str) -> None:
    got = frames(capture_path(name))
    assert got, name
    for _route, direction, frame in got:
        assert direction in "<>"
        (length,) = struct.unpack_from(">I", frame, 0)
        assert length == len(frame) - 4
        (mark,) = struct.unpack_from(">I", frame, 4)
        assert mark >> 24 in (0, 1)  # JSON or ROCKETMQ
        assert 8 + (mark & 0xFFFFFF) <= len(frame)


@pytest.mark.parametrize("name", sorted(PROMISED))
def test_capture_holds_the_promised_requests(name: str) -> None:
    codes = {
        code
        for _r, _d, frame in frames(capture_path(name))
        for _ser, code, flag in [header_fields(frame)]
        if not flag & FLAG_RESPONSE
    }
    assert PROMISED[name] <= codes, f"{name} lacks {PROMISED[name] - codes}"


def test_the_binary_serialization_capture_is_binary_both_ways() -> None:
    got = frames(capture_path("producer_send_rocketmq_serialization"))
    sers = {(d, header_fields(f)[0]) for _r, d, f in got}
    assert sers == {(">", 1), ("<", 1)}
