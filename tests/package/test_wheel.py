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
from pathlib import Path

import pytest

from tests.support.procs import stop_popen

pytestmark = [pytest.mark.package, pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]


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
