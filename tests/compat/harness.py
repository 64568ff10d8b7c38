# Runs the real RocketMQ clients of tests/compat from Python: the Java scenario harness
# (tests/compat/java), mqadmin (rocketmq-tools 4.9.7, on the same classpath) and the Go
# harness (tests/compat/go, github.com/apache/rocketmq-client-go/v2), all built by
# scripts/bootstrap --compat. Every process runs in a session of its own and is killed by
# its PID when its deadline passes (a JVM with a bounded heap); a harness's stdout is JSON
# events, one per line.
from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JAVA_DIR = Path(__file__).resolve().parent / "java"
CLASSES = JAVA_DIR / "target" / "classes"
CLASSPATH_FILE = JAVA_DIR / "target" / "classpath.txt"
ROCKETMQ_HOME = JAVA_DIR / "home"  # conf/logback_tools.xml, which mqadmin insists on

# Small heap, one GC thread, quick start: several JVMs share 2 cores with a cluster.
JVM_FLAGS = ["-Xms32m", "-Xmx160m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto"]
GO_BIN = Path(__file__).resolve().parent / "go" / "bin" / "compat-go"
HARNESS_MAIN = "raftmq.compat.Harness"
MQADMIN_MAIN = "org.apache.rocketmq.tools.command.MQAdminStartup"


class HarnessMissing(RuntimeError):
    """The harness is not built: scripts/bootstrap --compat builds it."""


def classpath() -> str:
    if not CLASSPATH_FILE.is_file() or not (CLASSES / "raftmq" / "compat" / "Harness.class").is_file():
        raise HarnessMissing(f"{JAVA_DIR} is not built: run scripts/bootstrap --compat")
    return f"{CLASSES}{os.pathsep}{CLASSPATH_FILE.read_text().strip()}"


@dataclass(frozen=True)
class JavaRun:
    """What one harness or mqadmin process did: exit code (None: killed at its deadline), stdout, stderr."""

    rc: int | None
    stdout: str
    stderr: str

    @property
    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.stdout.splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    def tail(self, lines: int = 30) -> str:
        """The end of both streams, for assertion messages."""
        err = "\n".join(self.stderr.splitlines()[-lines:])
        out = "\n".join(self.stdout.splitlines()[-lines:])
        return f"rc={self.rc}\n--- stdout (end)\n{out}\n--- stderr (end)\n{err}"


def run_java(
    main: str,
    args: list[str],
    *,
    timeout_s: float,
    log_dir: Path,
    extra_flags: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> JavaRun:
    """Runs one JVM to completion or kills it (SIGKILL to its PID's group) at timeout_s."""
    log_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        "java",
        *JVM_FLAGS,
        *(extra_flags or []),
        f"-Drocketmq.client.logRoot={log_dir}",
        f"-Duser.home={log_dir}",
        "-cp",
        classpath(),
        main,
        *args,
    ]
    full_env = {**os.environ, "ROCKETMQ_HOME": str(ROCKETMQ_HOME), **(env or {})}
    return _run(cmd, full_env, timeout_s)


def _run(cmd: list[str], full_env: dict[str, str], timeout_s: float) -> JavaRun:
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return JavaRun(proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        return JavaRun(None, out, err)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def run_scenario(
    scenario: str,
    namesrv: str,
    *,
    log_dir: Path,
    timeout_s: float = 60,
    extra_flags: list[str] | None = None,
    client: str = "java",
    env: dict[str, str] | None = None,
    **opts: object,
) -> JavaRun:
    """Runs the `client` harness ("java" or "go"): SCENARIO NAMESRV key=value...; its own
    deadline is timeout_s less 10 s, so it reports what was missing before it is killed.
    `env`: more environment (the Java harness's access key and secret key, never argv)."""
    args = [scenario, namesrv, f"timeoutS={max(5, int(timeout_s) - 10)}"]
    args += [f"{k}={v}" for k, v in opts.items()]
    if client == "go":
        if not GO_BIN.is_file():
            raise HarnessMissing(f"{GO_BIN} is not built: run scripts/bootstrap --compat")
        log_dir.mkdir(parents=True, exist_ok=True)
        return _run([str(GO_BIN), *args], {**os.environ, "HOME": str(log_dir)}, timeout_s)
    return run_java(HARNESS_MAIN, args, timeout_s=timeout_s, log_dir=log_dir, extra_flags=extra_flags,
                    env=env)


class Background:
    """A harness started without waiting: stdout to a file, read while it runs; killed by
    its PID group at `wait`'s deadline or by `kill` (a test's finally)."""

    def __init__(self, cmd: list[str], env: dict[str, str], log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.stdout_path, self.stderr_path = log_dir / "stdout.jsonl", log_dir / "stderr.log"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, start_new_session=True)

    def events(self, kind: str) -> list[dict[str, Any]]:
        """The complete event lines of `kind` printed so far."""
        out = []
        for line in self.stdout_path.read_text().splitlines():
            if line.startswith("{") and line.endswith("}"):
                e = json.loads(line)
                if e["event"] == kind:
                    out.append(e)
        return out

    def wait(self, timeout_s: float) -> JavaRun:
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        return JavaRun(self.proc.returncode if self.proc.returncode is not None and self.proc.returncode >= 0
                       else None, self.stdout_path.read_text(), self.stderr_path.read_text())

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def start_scenario(
    scenario: str, namesrv: str, *, log_dir: Path, timeout_s: float, **opts: object
) -> Background:
    """The Java harness's `scenario` started in the background (its own deadline timeout_s)."""
    args = [scenario, namesrv, f"timeoutS={int(timeout_s)}", *(f"{k}={v}" for k, v in opts.items())]
    cmd = ["java", *JVM_FLAGS, f"-Drocketmq.client.logRoot={log_dir}", f"-Duser.home={log_dir}",
           "-cp", classpath(), HARNESS_MAIN, *args]
    return Background(cmd, {**os.environ, "ROCKETMQ_HOME": str(ROCKETMQ_HOME)}, log_dir)


def mqadmin(command: list[str], namesrv: str, *, log_dir: Path, timeout_s: float = 40) -> JavaRun:
    """`mqadmin COMMAND ... -n NAMESRV` (rocketmq-tools 4.9.7's MQAdminStartup)."""
    return run_java(MQADMIN_MAIN, [*command, "-n", namesrv], timeout_s=timeout_s, log_dir=log_dir)


def keys_in_order(events: list[dict[str, Any]], key: str) -> Iterator[int]:
    """The `seq` of every event of one key, in the order they were printed."""
    for e in events:
        if e.get("key") == key and e.get("seq") is not None:
            yield int(e["seq"])
