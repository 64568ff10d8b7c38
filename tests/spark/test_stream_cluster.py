"""Structured Streaming from followers into a parquet sink, exactly once across runs and a
SIGKILL of the driver (and its JVM) in the middle of a micro-batch.

The query runs in its own process (``tests/spark/stream_job.py``): an availableNow run; new
data; a resumed processingTime run that gets more new data while it runs and is killed
mid-batch; a final availableNow run on the same checkpoint. The sink, read through Spark (its
``_spark_metadata`` log names the committed files), must hold every message once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from raftmq.local_group import LocalGroup
from tests.spark.conftest import SPARK_ENV, create_topic, leader_name, pulled, send, servers, wait_caught_up
from tests.support.procs import ManagedProcess, ProcessGroup

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "stream"


def batch_ids(checkpoint: Path, kind: str) -> list[int]:
    d = checkpoint / kind
    return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.exists() else []


def source_offsets(checkpoint: Path, batch: int) -> dict[tuple[str, int], int]:
    """The raftmq offsets Spark logged for ``batch`` (the last line of offsets/N)."""
    doc = json.loads((checkpoint / "offsets" / str(batch)).read_text().strip().splitlines()[-1])
    return {(g, int(q)): o for g, queues in doc.items() for q, o in queues.items()}


def batch_sizes(checkpoint: Path, batches: list[int]) -> list[int]:
    sizes = []
    for b in batches:
        end = source_offsets(checkpoint, b)
        start = source_offsets(checkpoint, b - 1) if b > 0 else {}
        sizes.append(sum(o - start.get(k, 0) for k, o in end.items()))
    return sizes


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: [state, ppid, ...]; None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> list[tuple[int, str]]:
    """Every live process below ``pid`` (the driver's JVM and its Python workers), as
    (pid, start time) so that a PID reused later is never signalled."""
    parent: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            parent[int(entry)] = (int(st[1]), st[19])
    found: list[tuple[int, str]] = []
    frontier = {pid}
    while frontier:
        kids = {c for c, (pp, _) in parent.items() if pp in frontier and c not in {f[0] for f in found}}
        found += [(c, parent[c][1]) for c in sorted(kids)]
        frontier = kids
    return found


def kill_pid(proc: tuple[int, str]) -> None:
    """SIGKILL ``proc`` if that PID is still the process seen (same start time)."""
    pid, started = proc
    st = _stat(pid)
    if st is not None and st[19] == started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("Z", "X"):  # dead; its parent reaps it
            return
        assert time.monotonic() < deadline, f"process {pid} still alive after SIGKILL"
        time.sleep(0.05)


def test_stream_is_exactly_once_across_resumes_and_a_driver_kill(
        spark_session: Any, brokers: LocalGroup, tmp_path: Path) -> None:
    create_topic(brokers, TOPIC, queues=4)
    checkpoint, out = tmp_path / "checkpoint", tmp_path / "out"
    job = [sys.executable, "-m", "tests.spark.stream_job", "--servers", ",".join(servers(brokers)),
           "--topic", TOPIC, "--checkpoint", str(checkpoint), "--out", str(out)]
    jvms: list[tuple[int, str]] = []

    def run(procs: ProcessGroup, name: str, *extra: str, timeout: float = 150) -> None:
        p = procs.start(name, [*job, *extra], env=SPARK_ENV, cwd=ROOT)
        try:
            status = p.wait(timeout)
        except Exception:
            raise AssertionError(f"{name} did not finish in {timeout} s:\n{p.log_tail()}") from None
        assert status == 0, f"{name} exited {status}:\n{p.log_tail()}"

    sent = send(brokers, TOPIC, 12_000, queues=4, prefix="w1")
    took: dict[str, float] = {}
    with ProcessGroup(tmp_path / "logs") as procs:
        try:
            # 1. a first availableNow run, admission control: batches of at most 5,000
            wait_caught_up(brokers)
            leader = leader_name(brokers)
            before = pulled(brokers)
            started = time.monotonic()
            run(procs, "run1", "--trigger", "available", "--max-per-trigger", "5000")
            took["run1"] = time.monotonic() - started
            first = batch_ids(checkpoint, "commits")
            sizes = batch_sizes(checkpoint, first)
            assert sum(sizes) == 12_000 and max(sizes) <= 5_000 and len(first) >= 3, sizes

            # 2. new data, then a resumed processingTime run that gets more new data while it
            #    runs and is killed with SIGKILL in the middle of a batch
            send(brokers, TOPIC, 3_000, queues=4, prefix="w2", sent=sent)
            started = time.monotonic()
            p = procs.start("run2", [*job, "--trigger", "processing", "--max-per-trigger", "1500",
                                     "--seconds", "120"], env=SPARK_ENV, cwd=ROOT)
            _wait_batches(p, checkpoint, len(first) + 1)
            send(brokers, TOPIC, 15_000, queues=4, prefix="w3", sent=sent)
            killed_in = _kill_mid_batch(p, checkpoint, 15_000, jvms)
            took["run2"] = time.monotonic() - started
            assert batch_ids(checkpoint, "offsets")[-1] == killed_in
            assert killed_in not in batch_ids(checkpoint, "commits")
            sizes = batch_sizes(checkpoint, [b for b in batch_ids(checkpoint, "offsets") if b > first[-1]])
            assert max(sizes) <= 1_500, sizes  # admission control with processingTime

            # 3. resume after the crash: the killed batch runs again with the same offsets
            wait_caught_up(brokers)
            started = time.monotonic()
            run(procs, "run3", "--trigger", "available")
            took["run3"] = time.monotonic() - started
        finally:
            for proc in jvms:
                kill_pid(proc)
    after = pulled(brokers)
    assert after[leader] - before[leader] == 0, "the leader served reads"

    rows = spark_session.read.parquet(str(out)).collect()
    assert len(rows) == sent.count() == 30_000
    assert len({r.msg_id for r in rows}) == len(rows), "a message was written twice"
    assert {r.msg_id for r in rows} == sent.ids
    for key, ids in sent.by_queue.items():
        offsets = sorted(r.queue_offset for r in rows if (r.broker_group, r.queue_id) == key)
        assert offsets == list(range(len(ids)))
    print(f"exactly once: {len(rows)} rows; killed mid-batch {killed_in}; batches "
          f"{len(batch_ids(checkpoint, 'commits'))}; seconds per run {took}")


def _wait_batches(p: ManagedProcess, checkpoint: Path, count: int) -> None:
    """Wait until ``count`` batches are committed (the run is up and reading)."""
    deadline = time.monotonic() + 90
    while len(batch_ids(checkpoint, "commits")) < count:
        assert p.alive, f"the run exited early:\n{p.log_tail()}"
        assert time.monotonic() < deadline, f"no batch committed within 90 s:\n{p.log_tail()}"
        time.sleep(0.05)


def _kill_mid_batch(p: ManagedProcess, checkpoint: Path, beyond: int, jvms: list[tuple[int, str]]) -> int:
    """Wait until a batch that reads past the first ``beyond`` messages of the topic (data
    that arrived during the run) is planned but not committed, then SIGKILL the driver, its
    JVM and the JVM's Python workers (by the PIDs seen below the driver). Returns the
    interrupted batch."""
    deadline = time.monotonic() + 120
    while True:
        assert p.alive, f"the processing run exited early:\n{p.log_tail()}"
        assert time.monotonic() < deadline, f"no batch to interrupt within 120 s:\n{p.log_tail()}"
        jvms.extend(c for c in descendants(p.pid) if c not in jvms)
        commits, offsets = batch_ids(checkpoint, "commits"), batch_ids(checkpoint, "offsets")
        if offsets and commits and offsets[-1] > commits[-1] \
                and sum(source_offsets(checkpoint, offsets[-1]).values()) > beyond:
            in_flight = offsets[-1]
            p.kill()
            for pid in jvms:
                kill_pid(pid)
            for pid, _ in jvms:
                wait_gone(pid, 10)
            return in_flight
        time.sleep(0.01)
