"""The deploy test's fixture: docs/DEPLOY.md's hosts as network namespaces, formed once.

Needs root (``ip netns``): CI runs as root; anywhere else the tests fail saying so (they
never skip). Everything is removed at the end -- every process stopped by its PID, every
namespace deleted, the hosts' directories removed -- also when a test or the set-up fails;
the processes' logs are copied to pytest's tmp dir first (``deploy-logs``). At the end of the
run the steps' timings are written to the terminal (``tests.deploy.timings``), so a passing
CI run's log carries them.
"""

from __future__ import annotations

import os
import pwd
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy import timings
from tests.deploy.deployment import Deployment, deployment_hosts
from tests.deploy.hosts import ServiceUser

#: The uid/gid the units' ``User=raftmq`` runs as when the machine has no ``raftmq`` user
#: (the test creates no account: files are ``install -o``'d to these numbers).
FALLBACK_ID = 64077


def service_user() -> ServiceUser:
    try:
        entry = pwd.getpwnam("raftmq")
        return ServiceUser(entry.pw_uid, entry.pw_gid)
    except KeyError:
        return ServiceUser(FALLBACK_ID, FALLBACK_ID)


@pytest.fixture(scope="package")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    if os.geteuid() != 0:
        pytest.fail("tests/deploy needs root: it makes network namespaces (ip netns) for the hosts of "
                    "docs/DEPLOY.md; run it as root (CI does)", pytrace=False)
    logs = tmp_path_factory.mktemp("deploy-logs")
    # The hosts' roots must be reachable by the service user: pytest's tmp dir is root's 0700.
    work = Path(tempfile.mkdtemp(prefix="raftmq-deploy-"))
    work.chmod(0o755)
    operator = work / "operator"
    operator.mkdir()
    with deployment_hosts(work, logs, operator, service_user()) as deployment:
        yield deployment


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The deploy steps' timings (``tests.deploy.timings``) at the end of the run, pass or fail."""
    if not timings.LINES:
        return
    terminalreporter.section("deploy step timings")
    for test, line in timings.LINES:
        terminalreporter.write_line(f"{test}: {line}")
