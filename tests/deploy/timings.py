"""The deploy test's step timings, for the CI log.

Each test calls :func:`record` with one line (what it did, how long it took); the line is
printed (seen with ``-s`` or in a failure's captured output) and kept, and the package's
``conftest.pytest_terminal_summary`` writes every kept line in a "deploy step timings"
section at the end of the run -- on a pass too, where pytest shows no captured output.
"""

from __future__ import annotations

__all__ = ["LINES", "record"]

#: (test, line) in the order recorded
LINES: list[tuple[str, str]] = []


def record(test: str, line: str) -> None:
    """Keep ``line`` for the run's summary under ``test``'s name, and print it."""
    LINES.append((test, line))
    print(line)
