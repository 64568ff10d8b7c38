"""The checkout's benchmarks (``benchmarks/``, figures in docs/BENCHMARKS.md) still run, on a
tiny load; what they measure is never asserted here."""

from __future__ import annotations

import pytest

from benchmarks import acl, pop_apply


def test_the_acl_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    acl.main(requests=20)
    out = capsys.readouterr().out
    assert "SEND_BATCH of 64 x 256 B" in out and "PULL" in out


def test_the_pop_apply_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    pop_apply.main(["--messages", "256", "--in-flight", "40"])
    out = capsys.readouterr().out
    assert "256 claims" in out and "216 acks" in out and "40 in flight" in out
