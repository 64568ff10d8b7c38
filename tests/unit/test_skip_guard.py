"""``scripts/test`` fails on any skip (``tests/support/skip_guard.py``): checked on a small
suite run in a pytest subprocess, with the plugin as ``scripts/test`` loads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITE = '''
import pytest
def test_passes(): pass
@pytest.mark.xfail(strict=True)
def test_expected_failure(): assert False
{extra}
'''


def _run(tmp_path: Path, extra: str, *plugin: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_small.py").write_text(SUITE.format(extra=extra))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin, "-rs", "test_small.py"]
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


def test_a_skip_passes_plain_pytest_but_fails_with_the_guard(tmp_path: Path) -> None:
    skip = "def test_skips(): pytest.skip('needs root')"
    assert _run(tmp_path, skip).returncode == 0  # what scripts/test did before
    done = _run(tmp_path, skip, "-p", "tests.support.skip_guard")
    assert done.returncode == 1, done.stdout
    assert "test_small.py::test_skips: Skipped: needs root" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].startswith("=")  # pytest's own closing line comes last
    assert "1 passed, 1 skipped, 1 xfailed" in done.stdout.splitlines()[-1]


def test_a_skip_marked_allowed_and_an_xfail_pass(tmp_path: Path) -> None:
    allowed = ("@pytest.mark.allowed_skip(reason='demo')\n"
               "def test_may_skip(): pytest.skip('not here')")
    done = _run(tmp_path, allowed, "-p", "tests.support.skip_guard")
    assert done.returncode == 0, done.stdout
    assert _run(tmp_path, "", "-p", "tests.support.skip_guard").returncode == 0
