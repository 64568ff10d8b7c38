"""A fresh clone's ``scripts/run`` serves RocketMQ's habits: the name server on
127.0.0.1:9876, ``Producer(namesrv="127.0.0.1:9876")`` and ``Producer()`` with
``$RAFTMQ_NAMESRV``, and the README's Python example as written.

The only test of the suite that takes port 9876 (tests/conftest.py keeps every other
cluster off it). If the port is taken on this machine the test fails and says by what.
The clone shares this checkout's bootstrapped ``.venv`` (same pyproject: nothing to install).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster_dir import cluster_pids, kill_alive, pid_alive, read_until_ready

pytestmark = [pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]
README_SNIPPET = re.compile(r"```python\n(.*?)```", re.S)
LAG_ZERO = """
import time
from client import Admin
admin, deadline = Admin(), time.monotonic() + 30
while sum(r.lag for r in admin.progress("billing", "orders")) and time.monotonic() < deadline:
    time.sleep(0.2)
assert sum(r.lag for r in admin.progress("billing", "orders")) == 0, "billing did not consume"
print("sent", r.msg_id)
c.shutdown(); p.shutdown(); admin.close()
"""


def _port_9876_free() -> str | None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", 9876))
        except OSError as e:
            users = subprocess.run(["ss", "-ltnp", "sport = :9876"], capture_output=True, text=True).stdout
            return f"127.0.0.1:9876 is taken on this machine ({e}); held by:\n{users}"
    return None


def _fresh_clone(tmp_path: Path) -> Path:
    venv = ROOT / ".venv"
    stamp = venv / ".raftmq-installed"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    assert stamp.exists() and stamp.read_text().strip() == want, (
        f"{venv} is not bootstrapped for this pyproject.toml: run scripts/bootstrap first")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True,
                   timeout=60)
    assert (clone / "pyproject.toml").read_bytes() == (ROOT / "pyproject.toml").read_bytes(), (
        "commit pyproject.toml: the clone's differs, and bootstrap would reinstall the shared .venv")
    (clone / ".venv").symlink_to(venv)
    return clone


def _python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("RAFTMQ_NAMESRV", "RAFTMQ_NAMESRV_PORT")}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=90,
                          env={**clean, "PYTHONPATH": str(ROOT), **env})


def test_scripts_run_serves_rocketmq_defaults(tmp_path: Path) -> None:
    taken = _port_9876_free()
    assert taken is None, taken
    clone = _fresh_clone(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("RAFTMQ_NAMESRV_PORT", "RAFTMQ_RUN_DIR")}
    run = subprocess.Popen(["bash", "scripts/run"], cwd=clone, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    pids: list[int] = []
    try:
        printed = read_until_ready(run, timeout=120)
        pids = cluster_pids(clone / "run")
        state = json.loads((clone / "run" / "cluster.json").read_text())
        assert state["namesrv"]["address"] == "127.0.0.1:9876"
        assert 'Producer(namesrv="127.0.0.1:9876")' in printed

        made = subprocess.run([str(clone / ".venv" / "bin" / "raftmq"), "topic", "create", "orders"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60,
                              env={k: v for k, v in env.items() if k != "RAFTMQ_NAMESRV"})
        assert made.returncode == 0, made.stderr  # no --dir, no cluster.json here: 127.0.0.1:9876

        (snippet,) = README_SNIPPET.findall((clone / "README.md").read_text())
        readme = _python(snippet + LAG_ZERO, clone)
        assert readme.returncode == 0 and "sent" in readme.stdout, readme.stderr

        send = ("from client import Producer, Message\n"
                "p = Producer({where}).start()\n"
                "print(p.send(Message('orders', b'x')).status.value); p.shutdown()\n")
        explicit = _python(send.format(where='namesrv="127.0.0.1:9876"'), tmp_path)
        assert explicit.stdout.strip() == "SEND_OK", explicit.stderr
        from_env = _python(send.format(where=""), tmp_path, RAFTMQ_NAMESRV="127.0.0.1:9876")
        assert from_env.stdout.strip() == "SEND_OK", from_env.stderr
        elsewhere = _python(send.format(where=""), tmp_path, RAFTMQ_NAMESRV="127.0.0.1:1")
        assert elsewhere.returncode != 0  # Producer() really asked $RAFTMQ_NAMESRV

        os.killpg(run.pid, signal.SIGINT)
        assert run.wait(timeout=30) == 0
        assert not any(pid_alive(p) for p in pids)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        kill_alive(pids)
