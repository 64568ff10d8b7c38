"""RaftMQ installed as users install it: the wheel built by ``python -m build`` and
installed with pip into a clean venv (no checkout on the path), then ``raftmq --help``,
``raftmq cluster up``, a send and a consume, and the console serving its packaged assets.
Every process started is stopped by PID (the cluster by ``raftmq cluster down``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.support.procs import stop_popen

pytestmark = [pytest.mark.package, pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]
#: the packages users run; benchmarks/ and tests/ stay in the checkout
PACKAGES = {"common", "protocol", "dledger", "broker", "client", "spark", "raftmq", "console"}
#: benchmarks that are CLI commands (``raftmq bench``, ``raftmq bench-log``) ship
CLI_BENCHMARKS = {"raftmq/bench.py", "raftmq/bench_read.py", "raftmq/bench_log.py",
                  "raftmq/bench_breakdown.py"}


def _run(*args: str | Path, cwd: Path, timeout: float = 300,
         **kw: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env, **kw)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
    return done  # type: ignore[no-any-return]


def test_the_wheel_installs_in_a_clean_venv_and_runs_a_cluster(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "build", "--wheel", "--outdir", dist, ROOT, cwd=tmp_path)
    (wheel,) = dist.glob("raftmq-*.whl")
    assert not_shipped(wheel) == []
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    _run(venv / "bin" / "python", "-m", "pip", "install", "--quiet", wheel, cwd=tmp_path)
    where = _run(venv / "bin" / "python", "-c", "import raftmq, console.web as w; print(raftmq.__file__); "
                 "print(w.STATIC / 'app.js')", cwd=tmp_path).stdout.split()
    assert all(p.startswith(str(venv)) for p in where) and Path(where[1]).exists()

    raftmq = venv / "bin" / "raftmq"
    assert "console" in _run(raftmq, "--help", cwd=tmp_path).stdout
    d = tmp_path / "c"
    try:
        _run(raftmq, "cluster", "up", "--dir", d, "--namesrv-port", "0", cwd=tmp_path, timeout=120)
        _run(raftmq, "topic", "create", "wheel", "--queues", "2", "--dir", d, cwd=tmp_path, timeout=60)
        sent = json.loads(_run(raftmq, "send", "wheel", "from the wheel", "--json", "--dir", d, cwd=tmp_path,
                               timeout=60).stdout)
        assert sent["status"] == "SEND_OK"
        got = _run(raftmq, "consume", "wheel", "--from", "first", "--max", "1", "--idle", "10", "--json",
                   "--dir", d, cwd=tmp_path, timeout=60)
        assert json.loads(got.stdout)["body"] == "from the wheel"
        _console_serves_its_assets(raftmq, d, tmp_path)
    finally:
        subprocess.run([str(raftmq), "cluster", "down", "--dir", str(d)], capture_output=True, timeout=60)


def _console_serves_its_assets(raftmq: Path, d: Path, cwd: Path) -> None:
    proc = subprocess.Popen([str(raftmq), "console", "--dir", str(d), "--listen", "127.0.0.1:0"], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("console at "), line
        base = line.split()[2].rstrip("/")
        for path, needle in (("/", b"RaftMQ console"), ("/static/app.js", b"renderCluster"),
                             ("/static/charts.js", b"lineChart"), ("/static/style.css", b"--accent")):
            with urllib.request.urlopen(base + path, timeout=5) as resp:
                assert needle in resp.read(), path
    finally:
        stop_popen(proc)


def not_shipped(wheel: Path) -> list[str]:
    """The files of ``wheel`` that should not be in it: anything outside our packages and
    the dist-info, a test module, a benchmark that is no CLI command."""
    wrong = []
    for name in zipfile.ZipFile(wheel).namelist():
        top, _, rest = name.partition("/")
        module = name.rsplit("/", 1)[-1]
        if top.endswith(".dist-info"):
            continue
        if (top not in PACKAGES or module.startswith(("test_", "conftest")) or ("bench" in rest
                and name not in CLI_BENCHMARKS)):
            wrong.append(name)
    return wrong


def test_the_wheel_holds_no_benchmark_or_test_module(tmp_path: Path) -> None:
    _run(sys.executable, "-m", "build", "--wheel", "--outdir", tmp_path, ROOT, cwd=tmp_path)
    (wheel,) = tmp_path.glob("raftmq-*.whl")
    assert not_shipped(wheel) == []
    assert "broker/remoting/server.py" in zipfile.ZipFile(wheel).namelist()  # the check reads a real wheel


def test_the_wheel_check_names_a_benchmark_and_a_test_module(tmp_path: Path) -> None:
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name in ("broker/remoting/server.py", "raftmq/bench.py", "broker/bench_acl.py",
                     "benchmarks/wire.py", "tests/unit/test_x.py", "raftmq-0.1.0.dist-info/RECORD"):
            z.writestr(name, "")
    assert not_shipped(wheel) == ["broker/bench_acl.py", "benchmarks/wire.py", "tests/unit/test_x.py"]
