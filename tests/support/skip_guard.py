"""A pytest plugin that fails the run on any skipped test (``scripts/test`` loads it with
``-p tests.support.skip_guard``).

A skip is a test that did not run, and a suite that passes with tests not run has checked
less than it says. A test that must be able to skip says why in the marker this plugin
allows by name -- ``@pytest.mark.allowed_skip(reason="...")`` (none does today); every
other skip turns the exit status to 1 after pytest's own summary line, with the tests
named. A module skipped while it is collected (``pytest.skip(..., allow_module_level=True)``,
a module-level ``pytest.importorskip``) fails the run the same way. An expected failure
(``xfail``) is not a skip.
"""

from __future__ import annotations

import pytest

__all__ = ["MARKER"]

MARKER = "allowed_skip"
_SKIPPED = pytest.StashKey[list[str]]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(reason): this test may skip, for the reason given "
                                       "(tests/support/skip_guard.py)")
    config.stash[_SKIPPED] = []
    config.pluginmanager.register(_CollectionSkips(config), "skip_guard_collection")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and item.get_closest_marker(MARKER) is None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        item.config.stash[_SKIPPED].append(f"{item.nodeid}: {reason}")


class _CollectionSkips:
    """A module (or class) skipped while it is collected -- ``pytest.skip(...,
    allow_module_level=True)``, a module-level ``pytest.importorskip`` -- makes no test
    item, so ``pytest_runtest_makereport`` never sees it; it is a skip all the same. The
    ``allowed_skip`` marker cannot exempt it: the module never finished importing."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.config.stash[_SKIPPED].append(f"{report.nodeid} (whole module, at collection): {reason}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    skipped = config.stash.get(_SKIPPED, [])
    if skipped:
        terminalreporter.section("skipped tests fail this run (tests/support/skip_guard.py)", red=True)
        for line in skipped:
            terminalreporter.write_line(line)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if session.config.stash.get(_SKIPPED, []) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
