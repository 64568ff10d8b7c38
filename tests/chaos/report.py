"""Figures of the chaos scenarios: one row per scenario, written as JSON and as a markdown table.

``ChaosReport.add`` rewrites ``chaos-report.json`` and ``chaos-report.md`` in the report
directory after every scenario (so a partial run leaves its rows behind); the
session's terminal summary prints the table. The directory is ``bench-out/chaos`` at
the repository root (git-ignored) unless ``RAFTMQ_CHAOS_REPORT_DIR`` names another.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["ChaosReport", "report_dir"]

REPO_ROOT = Path(__file__).resolve().parents[2]

COLUMNS = [
    ("scenario", "scenario"), ("acked", "acked"), ("lost", "lost"), ("duplicated", "dup"),
    ("out_of_order", "out of order"), ("unknown", "unknown (stored)"), ("failover_s", "failover s"),
    ("failover_by_fault", "failover s by fault"),
    ("catch_up_s", "catch-up s"), ("max_stall_s", "send stall s"), ("consume_lag_s", "max consume lag s"),
    ("elections", "term rises"), ("confirmed", "fault confirmed"),
    ("checks", "digests / CQ units / monitor samples"),
    ("invariants", "invariants"), ("seed", "seed"), ("duration_s", "time s"),
]


def report_dir() -> Path:
    env = os.environ.get("RAFTMQ_CHAOS_REPORT_DIR")
    return Path(env) if env else REPO_ROOT / "bench-out" / "chaos"


def _times(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{max(values):.2f} max, {statistics.median(values):.2f} med ({len(values)}x)"


def _cell(row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    if key in ("failover_s", "catch_up_s"):
        return _times(list(value or []))
    if key == "failover_by_fault":
        by_kind = sorted((value or {}).items())
        return "; ".join(f"{kind} {_times(list(times))}" for kind, times in by_kind) or "-"
    if key == "checks":
        c = value or {}
        return f"{c.get('digest indexes', '-')} / {c.get('CQ units', '-')} / {c.get('monitor samples', '-')}"
    if key == "confirmed":
        return "; ".join(value) if value else "-"
    if key == "unknown":
        return f"{row.get('unknown', 0)} ({row.get('unknown_stored', 0)})"
    if isinstance(value, float):
        return f"{value:.2f}"
    return "-" if value is None else str(value)


class ChaosReport:
    def __init__(self, directory: Path, command: str) -> None:
        self.directory = directory
        self.command = command
        self.rows: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.started = time.time()

    def add(self, row: dict[str, Any]) -> None:
        with self._lock:
            self.rows = [r for r in self.rows if r["scenario"] != row["scenario"]] + [row]
            self._write()

    def markdown(self) -> str:
        head = "| " + " | ".join(title for _, title in COLUMNS) + " |"
        rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
        lines = [head, rule]
        for row in self.rows:
            lines.append("| " + " | ".join(_cell(row, key) for key, _ in COLUMNS) + " |")
        return "\n".join(lines)

    def _write(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        doc = {"command": self.command, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z",
                                                                  time.localtime(self.started)),
               "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                           "platform": platform.platform()},
               "scenarios": self.rows}
        (self.directory / "chaos-report.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        (self.directory / "chaos-report.md").write_text(
            f"Command: `{self.command}`\n\n{self.markdown()}\n")
