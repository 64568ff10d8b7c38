"""``scripts/test`` fails on any skip (``tests/support/skip_guard.py``): checked on a small
suite run in a pytest subprocess, with the plugin as ``scripts/test`` loads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = '''
import pytest
def test_passes(): pass
@pytest.mark.xfail(strict=True)
def test_expected_failure(): assert False
{extra}
'''


def _run(tmp_path: Path, extra: str, *plugin: str,
         beside: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """pytest on ``test_small.py`` (``SUITE`` with ``extra``) and the modules of ``beside``
    (file name -> source), in a subprocess."""
    (tmp_path / "test_small.py").write_text(SUITE.format(extra=extra))
    for name, source in (beside or {}).items():
        (tmp_path / name).write_text(source)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin, "-rs", "test_small.py",
            *(beside or {})]
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


#: modules skipped while pytest collects them: no test item is made, so no test report
COLLECTION_SKIPS = {
    "skip": "import pytest\npytest.skip('no GPU here', allow_module_level=True)\ndef test_x(): pass\n",
    "importorskip": "import pytest\npytest.importorskip('no_such_module_raftmq')\ndef test_x(): pass\n",
}


@pytest.mark.parametrize("how", sorted(COLLECTION_SKIPS))
def test_a_module_skipped_at_collection_fails_with_the_guard(tmp_path: Path, how: str) -> None:
    beside = {"test_skipped_module.py": COLLECTION_SKIPS[how]}
    assert _run(tmp_path, "", beside=beside).returncode == 0  # plain pytest: "1 skipped", exit 0
    done = _run(tmp_path, "", "-p", "tests.support.skip_guard", beside=beside)
    assert done.returncode == 1, done.stdout
    assert "test_skipped_module.py (whole module, at collection)" in done.stdout
    assert ("no GPU here" if how == "skip" else "no_such_module_raftmq") in done.stdout
