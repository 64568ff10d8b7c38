"""Small process helpers shared by every multi-process test.

Contracts:

* :func:`free_ports` returns ports that were free on 127.0.0.1 a moment ago; another
  process may still grab one before the caller binds it (the usual race, kept small
  by binding all of them at once and releasing them together).
* :func:`wait_until` polls with a hard deadline and never sleeps past it.
* :class:`ManagedProcess` runs one argv (no shell, so its PID is the program's PID)
  with stdout and stderr appended to a log file; every signal goes to that PID only,
  and only while the child has not been reaped (so a recycled PID is never hit).
* :class:`ProcessGroup` stops every process it started, by PID, when its ``with``
  block ends -- also when the block raises; the block's exception is never swallowed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol, Self, TypeVar

from raftmq.local_group import free_port

__all__ = ["ManagedProcess", "ProcessGroup", "free_ports", "led", "rss_bytes", "stop_popen", "wait_until"]

T = TypeVar("T")

LOCALHOST = "127.0.0.1"


class _Group(Protocol):
    def start(self) -> object: ...
    def stop(self) -> object: ...


G = TypeVar("G", bound=_Group)


@contextlib.contextmanager
def led(group: G, leader: Callable[[G], object], timeout: float = 30.0) -> Iterator[G]:
    """``group`` started, and ``leader(group, timeout=...)`` (its wait for a leader: a
    ``LocalGroup``'s ``wait_leader``, a chaos group's ``leader``) returned; stopped by PID
    when the block ends, also when starting or the wait fails."""
    try:
        group.start()
        leader(group, timeout=timeout)  # type: ignore[call-arg]
        yield group
    finally:
        group.stop()


def rss_bytes(pid: int) -> int:
    """The resident memory of process ``pid`` (Linux: /proc/PID/status VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def free_ports(n: int) -> list[int]:
    """Return ``n`` distinct TCP ports free on 127.0.0.1, below the ephemeral range.

    See ``raftmq.local_group.free_port`` for why not bind(0).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return [free_port() for _ in range(n)]


def stop_popen(proc: subprocess.Popen[str] | subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM ``proc`` (its PID only), SIGKILL it after ``timeout`` s, and reap it."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    interval: float = 0.05,
    what: str = "condition",
) -> T:
    """Call ``predicate`` until it returns something truthy and return that value.

    Exceptions raised by ``predicate`` count as "not yet" and are remembered. The
    predicate runs at least once; after ``timeout`` seconds a :class:`TimeoutError`
    naming ``what`` and the last exception seen (also chained as ``__cause__``) is raised.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            result = predicate()
        except Exception as exc:
            last_exc = exc
        else:
            if result:
                return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            detail = f"; last error: {last_exc!r}" if last_exc is not None else ""
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}{detail}") \
                from last_exc
        time.sleep(min(interval, remaining))


class ManagedProcess:
    """One child process whose output goes to ``log_path`` (appended).

    The process starts in the constructor. ``argv[0]`` is executed directly, without
    a shell. ``env`` entries are added to (not substituted for) the current environment.
    Leaving a ``with`` block stops it (``stop``), also on an exception.
    """

    def __init__(
        self,
        argv: Sequence[str | os.PathLike[str]],
        log_path: Path,
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.argv = [os.fspath(a) for a in argv]
        self.log_path = Path(log_path)
        self.name = name or Path(self.argv[0]).name
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        full_env = {**os.environ, **env} if env is not None else None
        with open(self.log_path, "ab") as log:
            self._popen = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=full_env, cwd=cwd,
            )

    def __repr__(self) -> str:
        state = "alive" if self.alive else f"exited {self.returncode}"
        return f"<ManagedProcess {self.name} pid={self.pid} {state}>"

    @property
    def pid(self) -> int:
        """The child's PID (stays readable after it exits)."""
        return self._popen.pid

    @property
    def alive(self) -> bool:
        """True while the child has not exited (reaps it if it has)."""
        return self._popen.poll() is None

    @property
    def returncode(self) -> int | None:
        """Exit status (negative signal number if killed), None while running."""
        return self._popen.poll()

    def wait(self, timeout: float) -> int:
        """Wait up to ``timeout`` s for the exit; raises ``subprocess.TimeoutExpired``."""
        return self._popen.wait(timeout)

    def kill(self, timeout: float = 5.0) -> int:
        """SIGKILL the PID (a crash, no clean-up) and reap it; returns the exit status."""
        self._signal(signal.SIGKILL)
        return self._popen.wait(timeout)

    def stop(self, timeout: float = 5.0) -> int:
        """SIGTERM, wait up to ``timeout`` s, then SIGKILL; returns the exit status.

        Idempotent: stopping an exited process only reaps it.
        """
        self._signal(signal.SIGTERM)
        try:
            return self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return self.kill()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def log_tail(self, n: int = 40) -> str:
        """The last ``n`` lines of the log ("" if it does not exist yet)."""
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return ""
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-n:])

    def _signal(self, sig: signal.Signals) -> None:
        # Popen.send_signal skips processes already reaped, so a reused PID is safe.
        with contextlib.suppress(ProcessLookupError):
            self._popen.send_signal(sig)


class ProcessGroup:
    """Starts processes and stops them all (by PID, newest first) on exit.

    Logs go to ``log_dir / f"{name}.log"``. On exit every process gets
    :meth:`ManagedProcess.stop` with ``stop_timeout``; a failure to stop one does not
    prevent stopping the others, and an exception from the ``with`` body propagates.
    """

    def __init__(self, log_dir: Path, stop_timeout: float = 5.0) -> None:
        self.log_dir = Path(log_dir)
        self.stop_timeout = stop_timeout
        self.processes: list[ManagedProcess] = []

    def start(
        self,
        name: str,
        argv: Sequence[str | os.PathLike[str]],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> ManagedProcess:
        """Start ``argv`` as process ``name`` and track it."""
        proc = ManagedProcess(argv, self.log_dir / f"{name}.log", name=name, env=env, cwd=cwd)
        self.processes.append(proc)
        return proc

    def stop_all(self) -> None:
        """Stop every tracked process; re-raises the first error after trying all."""
        errors: list[BaseException] = []
        for proc in reversed(self.processes):
            try:
                proc.stop(self.stop_timeout)
            except BaseException as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_all()
