"""What a scenario did not do to its broker processes: deaths it did not cause, errors it did not expect.

``NodeDeaths`` is told which nodes the test stops on purpose (kill -9, SIGTERM, retire)
and when they start again; ``check`` records every other process found exited -- its
node, exit status, when it was seen and the tail of its log -- once per process. The
offsets monitor calls it every 0.3 s, and so does everything that would restart a node
that is down (``Scenario.finish``, ``Nemesis.recover``), so a broker that crashes on its
own is never restarted silently like one the test killed.

``unexpected_log_lines`` reads a node's log for ERROR and CRITICAL lines and tracebacks,
minus those a scenario expects (regular expressions matched against the log line; a
traceback belongs to the line before it).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from raftmq.local_group import LocalGroup

__all__ = ["ALWAYS_EXPECTED", "BEHIND_RETAINED_START", "Death", "NodeDeaths", "unexpected_log_lines"]

#: Lines every scenario may see: a client link reset while the broker answered its WebSocket
#: handshake is logged at ERROR with its traceback by the JSON error middleware (noted in
#: issue 31's report; the broker's logging is not the chaos suite's to change). Only with a
#: connection reset as the exception (matched against the line followed by " -- " and the
#: exception its traceback ends with): a /ws handler failing otherwise is unexpected.
ALWAYS_EXPECTED = (r"ERROR dledger\.http: GET /ws failed.* -- "
                   r"(aiohttp\.client_exceptions\.ClientConnectionResetError|ConnectionResetError|BrokenPipeError)\b",)
#: With retention on, a replica behind the leader's retained start restarts its log there and
#: waits for the snapshot -- the designed path, which dledger logs at ERROR.
BEHIND_RETAINED_START = (
    r"ERROR dledger\.journal: log restarted at index \d+, position \d+: entries \d+\.\.\d+ were deleted "
    r"by retention",
    r"ERROR dledger\.applier: cannot apply: entries \d+\.\.\d+ were deleted before this node had them",
    r"ERROR dledger\.replicated_log: this node no longer stands for election: its state machine waits "
    r"for a snapshot")
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ [A-Z]+ ")
_LEVEL = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ (ERROR|CRITICAL) ")
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
TAIL_LINES = 25


@dataclass(frozen=True, slots=True)
class Death:
    node: str
    pid: int
    exit_status: int
    seen_at: float  # time.monotonic() when it was found exited
    log_tail: str

    def describe(self, since: float) -> str:
        return (f"{self.node} (pid {self.pid}) died on its own with exit status {self.exit_status}, "
                f"found at +{self.seen_at - since:.1f}s; its log ends:\n{self.log_tail}")


class NodeDeaths:
    """The unexpected deaths among ``group``'s processes (module docstring)."""

    def __init__(self, group: LocalGroup) -> None:
        self._group = group
        self._stopping: set[int] = set()  # PIDs the test stopped or is stopping
        self._seen: set[int] = set()
        self._lock = threading.Lock()  # the offsets monitor's thread checks too
        self.deaths: list[Death] = []

    def stopping(self, name: str) -> None:
        """The test is about to stop ``name`` (whatever its current process)."""
        proc = self._group.nodes[name].proc
        if proc is not None:
            self.check([name])  # it may have died before the test got to it
            with self._lock:
                self._stopping.add(proc.pid)

    def check(self, names: Iterable[str] | None = None) -> list[Death]:
        """Record every process of ``names`` (default: all) that exited without being
        stopped by the test; returns the new ones."""
        new = []
        with self._lock:
            for name in names if names is not None else list(self._group.nodes):
                proc = self._group.nodes[name].proc
                if proc is None or proc.pid in self._stopping or proc.pid in self._seen:
                    continue
                status = proc.poll()
                if status is None:
                    continue
                self._seen.add(proc.pid)
                tail = self._group.log_tail(name, TAIL_LINES)
                new.append(Death(name, proc.pid, status, time.monotonic(), tail))
            self.deaths.extend(new)
        return new


def unexpected_log_lines(path: Path, expected: Iterable[str] = ()) -> list[str]:
    """The ERROR/CRITICAL lines and tracebacks of the log at ``path`` that match none of
    ``expected`` (nor ``ALWAYS_EXPECTED``). A traceback right after a log line (or chained
    to one that is) is shown as that line; any other as its exception line."""
    if not path.exists():
        return []
    patterns = [re.compile(p) for p in (*ALWAYS_EXPECTED, *expected)]
    lines = path.read_text(errors="replace").splitlines()
    found: list[str] = []
    owner = ""  # the log line the current traceback belongs to
    for i, line in enumerate(lines):
        if _LEVEL.match(line):
            shown = line
            traced = i + 1 < len(lines) and lines[i + 1].startswith(_TRACEBACK)
            raised = _raised(lines, i + 1) if traced else ""
        elif line.startswith(_TRACEBACK):
            before = lines[i - 1] if i else ""
            if _LOG_LINE.match(before):
                owner = before
            elif not (before == "" or before.startswith(_CHAINED)):
                owner = ""
            shown = f"{_TRACEBACK} after: {owner}" if owner else f"traceback: {_exception_line(lines, i)}"
            raised = _raised(lines, i)
        else:
            continue
        judged = f"{shown} -- {raised}" if raised else shown  # what the patterns are matched against
        if not any(p.search(judged) for p in patterns) and shown not in found:
            found.append(shown)
    return found


def _raised(lines: list[str], traceback_at: int) -> str:
    """The exception the traceback starting at ``traceback_at`` ends with: the last exception
    line before the next log line (chained tracebacks included)."""
    last = ""
    before = lines[traceback_at]
    for line in lines[traceback_at + 1:]:
        if _LOG_LINE.match(line) or (line.startswith(_TRACEBACK) and before != ""
                                     and not before.startswith(_CHAINED)):
            break  # the next log line, or another traceback not chained to this one
        if line and not line.startswith((" ", _TRACEBACK, *_CHAINED)):
            last = line
        before = line
    return last


def _exception_line(lines: list[str], traceback_at: int) -> str:
    """The exception a traceback starting at ``traceback_at`` ends with."""
    for line in lines[traceback_at + 1:]:
        if line and not line.startswith(" "):
            return line
    return "(cut)"
