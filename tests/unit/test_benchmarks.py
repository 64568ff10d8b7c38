"""The checkout's benchmarks (``benchmarks/``, figures in docs/BENCHMARKS.md) still run, on a
tiny load; what they measure is never asserted here."""

from __future__ import annotations

import pytest

from benchmarks import acl


def test_the_acl_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    acl.main(requests=20)
    out = capsys.readouterr().out
    assert "SEND_BATCH of 64 x 256 B" in out and "PULL" in out
