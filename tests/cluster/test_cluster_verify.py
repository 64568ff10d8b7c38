"""`raftmq cluster verify` compares every replica at a marker entry it has the leader propose
(issue 33): on a fresh cluster it compares at one index at least and says what it covered;
a ConsumeQueue byte flipped on one replica's disk behind its back is named, replica and
queue (exit 1); a replica that is down is named as not compared (exit 2)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from client import Message, Producer
from raftmq.local_group import LocalGroup
from tests.support.broker_group import create_topic, running_brokers, servers

pytestmark = [pytest.mark.cluster]

#: the low byte of the first unit's store time (broker.store.consume_queue_layout): nothing a
#: restart checks when it adopts the file, so the replica starts and serves with it
FLIPPED_BYTE = 31


def verify(group: LocalGroup, where: Path) -> subprocess.CompletedProcess[str]:
    (where / "cluster.json").write_text(json.dumps({
        "namesrv": {"address": "127.0.0.1:1", "pid": 0},
        "groups": {"g1": {n: {"address": p.http, "pid": p.proc.pid if p.proc else 0}
                          for n, p in group.nodes.items()}}}))
    return subprocess.run([sys.executable, "-m", "raftmq", "cluster", "verify", "--dir", str(where),
                           "--timeout", "20"], capture_output=True, text=True, timeout=120)


def caught_up(group: LocalGroup) -> None:
    leader = group.wait_leader(timeout=30)
    target = group.status(leader)["commit_index"]  # type: ignore[index]
    for name, node in group.nodes.items():
        if node.alive:
            group.wait_status(name, lambda s: s["applied_index"] >= target, 60, f"{name} applied {target}")


def test_verify_compares_at_a_marker_names_a_flipped_consume_queue_byte_and_a_replica_down(
        tmp_path: Path) -> None:
    with running_brokers(tmp_path / "brokers") as group:
        create_topic(group, "orders", 4)
        with Producer(servers=servers(group), group="p", send_timeout=20) as p:
            for key in ("a", "b", "c", "d", "e"):
                p.send(Message("orders", f"body-{key}".encode()), shard_key=key)

        fresh = verify(group, tmp_path)
        out = fresh.stdout + fresh.stderr
        assert fresh.returncode == 0, out
        found = re.search(r"g1: compared 3 replicas at index (\d+) \(marker\): (\d+) queues, "
                          r"(\d+) ConsumeQueue units; equal", fresh.stdout)
        assert found is not None, out
        assert int(found[1]) >= 1 and int(found[2]) >= 1 and int(found[3]) == 5, out
        assert "verify: OK" in fresh.stdout, out

        # One follower's ConsumeQueue altered on disk while it is down, then restarted.
        caught_up(group)
        leader = group.wait_leader(timeout=30)
        bad = next(n for n in group.nodes if n != leader)
        group.terminate(bad)
        queues = group.base / bad / "store" / "consumequeue" / "orders"
        qid, path = next((int(d.name), f) for d in sorted(queues.iterdir())
                         for f in sorted(d.iterdir()) if f.stat().st_size >= 40)
        data = bytearray(path.read_bytes())
        data[FLIPPED_BYTE] ^= 0x01
        path.write_bytes(bytes(data))
        group.start_node(bad)
        caught_up(group)
        flipped = verify(group, tmp_path)
        out = flipped.stdout + flipped.stderr
        assert flipped.returncode == 1, out
        line = next((x for x in flipped.stdout.splitlines() if "MISMATCH" in x), "")
        assert f"replica {bad}" in line and f"topic orders queue {qid}" in line, out

        # That replica stopped: the two others are compared, it is named as not compared.
        group.terminate(bad)
        down = verify(group, tmp_path)
        out = down.stdout + down.stderr
        assert down.returncode == 2, out
        assert re.search(rf"could not compare replica {bad}\b.*does not answer", down.stdout), out
        assert "g1: compared 2 replicas at index" in down.stdout, out
