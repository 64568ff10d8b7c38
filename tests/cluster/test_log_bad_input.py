"""Bad input to a log node: a corrupt segment, a bad config. Clear errors, nothing lost."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from dledger.storage.entry_format import HEADER_SIZE
from raftmq.local_group import LocalGroup
from tests.support.history import History
from tests.support.log_checks import assert_replicas_agree, converge
from tests.support.log_load import LogLoad

pytestmark = [pytest.mark.cluster]

SEGMENT = 256 * 1024


@pytest.fixture
def group(make_group: Callable[..., LocalGroup]) -> LocalGroup:
    return make_group(segment_bytes=SEGMENT)


def corrupt_header_mid_log(segment: Path) -> int:
    """Flip the magic of a record in the middle of a (non-last) segment; returns its offset."""
    data = bytearray(segment.read_bytes())
    offset = 0
    for _ in range(50):  # walk 50 records in: well inside the segment
        offset += int.from_bytes(data[offset + 4:offset + 8], "big")
    data[offset] ^= 0xFF
    segment.write_bytes(bytes(data))
    assert offset > HEADER_SIZE
    return offset


def test_corrupt_segment_is_refused_then_repaired_from_peers(group: LocalGroup) -> None:
    group.start()
    group.wait_leader()
    history = History()
    with LogLoad(group, history, workers=16, payload_bytes=300, limit=2500) as load:
        load.wait_acked(2500, timeout=120)
    converge(group)
    leader = group.wait_leader()
    victim = next(n for n in group.nodes if n != leader)
    group.terminate(victim)
    segments = sorted((group.base / victim / "commitlog").glob("0*"))
    assert len(segments) >= 3, "the test needs several segments"
    offset = corrupt_header_mid_log(segments[0])

    group.start_node(victim)
    proc = group.nodes[victim].proc
    assert proc is not None
    assert proc.wait(timeout=30) == 2
    message = group.log_tail(victim, 5)
    assert "CorruptLogError" in message and segments[0].name in message and str(offset) in message
    assert "repair" in message

    group.start_node(victim, "--repair-log")
    assert_replicas_agree(group, history)


def test_bad_config_exits_with_a_clear_message(tmp_path: Path) -> None:
    cfg = tmp_path / "n1.toml"
    cfg.write_text('[node]\nname = "n1"\n[group]\npeers = { n1 = "127.0.0.1:7001", '
                   'n2 = "127.0.0.1:7001" }\nsecret = "x"\n')
    out = subprocess.run([sys.executable, "-m", "dledger", "--config", str(cfg), "--http",
                          "127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "same address 127.0.0.1:7001" in out.stderr

    cfg.write_text('[node]\nname = "n1"\n[group]\npeers = { n1 = "127.0.0.1:7001", '
                   'n2 = "127.0.0.1:7002" }\n')
    out = subprocess.run([sys.executable, "-m", "dledger", "--config", str(cfg), "--http",
                          "127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "cluster secret" in out.stderr and "--insecure" in out.stderr
