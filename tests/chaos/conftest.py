"""Fixtures for the chaos tests: one real Toxiproxy server per session.

``toxiproxy`` (session) starts ``.venv/bin/toxiproxy-server`` on a free 127.0.0.1 port
and stops it by PID when the session ends, whatever happened. A missing binary FAILS
the tests that need it (it is never a skip): run ``scripts/bootstrap``.

``toxi`` (function) is a :class:`Toxi` on that server; after each test every proxy is
healed (``reset``) and deleted (``destroy_all``), so tests never see each other's links.

Message-level scenarios (``test_message_chaos.py``, ``test_verifier_selftest.py``):

* ``make_scenario(**options)`` builds a :class:`Scenario` on a fresh 3-broker group whose
  links all go through the session's Toxiproxy; every broker process is stopped by PID
  when the test ends, also on failure;
* ``chaos_seed``: ``--chaos-seed N`` or ``CHAOS_SEED=N`` replays a run (printed by every
  scenario and written in the report); otherwise a fresh random seed per test;
* ``chaos_duration``: seconds of randomized nemesis, ``--chaos-duration S`` or
  ``CHAOS_DURATION=S`` (default 20, what CI runs);
* the figures of every scenario go to ``bench-out/chaos/chaos-report.{json,md}`` (or
  ``$RAFTMQ_CHAOS_REPORT_DIR``) and the table is printed at the end of the session.

The two options only exist when pytest is pointed at ``tests/chaos`` (or a file in
it); the environment variables work however the suite is started.
"""

from __future__ import annotations

import os
import random
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.chaos.brokers import RETENTION, ChaosBrokers
from tests.chaos.node_health import BEHIND_RETAINED_START
from tests.chaos.report import ChaosReport, report_dir
from tests.chaos.scenario import Scenario
from tests.chaos.toxi import Toxi, ToxiproxyMissing, ToxiproxyServer, toxiproxy_binary
from tests.support.procs import free_ports

DEFAULT_NEMESIS_S = 20.0
_REPORT_KEY = pytest.StashKey[ChaosReport]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("chaos")
    group.addoption("--chaos-seed", type=int, default=None,
                    help="seed of every chaos scenario (replay a printed one); env CHAOS_SEED")
    group.addoption("--chaos-duration", type=float, default=None,
                    help=f"seconds of randomized nemesis (default {DEFAULT_NEMESIS_S:g}); "
                         "env CHAOS_DURATION")
    group.addoption("--soak-replace-every", type=float, default=600.0,
                    help="scripts/soak: seconds between host replacements (default 600)")


def _option(config: pytest.Config, name: str, env: str) -> str | None:
    try:
        value = config.getoption(name)
    except ValueError:  # the option was not registered (conftest loaded late)
        value = None
    return str(value) if value is not None else os.environ.get(env)


def _nemesis_seconds(config: pytest.Config) -> float:
    given = _option(config, "--chaos-duration", "CHAOS_DURATION")
    return float(given) if given is not None else DEFAULT_NEMESIS_S


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A longer nemesis gets a longer hard timeout (its duration plus 150 s)."""
    for item in items:
        if "chaos_duration" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(_nemesis_seconds(config) + 150), append=False)


@pytest.fixture(scope="session")
def toxiproxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToxiproxyServer]:
    """A running toxiproxy-server; stopped by PID at the end of the session."""
    binary: Path | None = None
    try:
        binary = toxiproxy_binary()
    except ToxiproxyMissing as exc:
        missing = str(exc)
    if binary is None:
        pytest.fail(missing, pytrace=False)  # outside the except: no chained traceback
    (port,) = free_ports(1)
    with ToxiproxyServer(binary, port, log_dir=tmp_path_factory.mktemp("toxiproxy")) as server:
        yield server


@pytest.fixture
def toxi(toxiproxy: ToxiproxyServer) -> Iterator[Toxi]:
    """A client of the session server; heals and deletes every proxy afterwards."""
    client = toxiproxy.client()
    try:
        yield client
    finally:
        try:
            client.reset()
        finally:
            client.destroy_all()


@pytest.fixture(scope="session")
def chaos_report(request: pytest.FixtureRequest) -> ChaosReport:
    config = request.config
    if _REPORT_KEY not in config.stash:
        python = Path(sys.executable)
        shown = python.relative_to(config.rootpath) if python.is_relative_to(config.rootpath) else python
        command = shlex.join([str(shown), "-m", "pytest", *config.invocation_params.args])
        config.stash[_REPORT_KEY] = ChaosReport(report_dir(), command)
    return config.stash[_REPORT_KEY]


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int:
    given = _option(request.config, "--chaos-seed", "CHAOS_SEED")
    seed = int(given) if given is not None else random.SystemRandom().randrange(2**32)
    print(f"chaos seed {seed} -- replay: CHAOS_SEED={seed} pytest '{request.node.nodeid}'")
    return seed


@pytest.fixture
def chaos_duration(request: pytest.FixtureRequest) -> float:
    return _nemesis_seconds(request.config)


@pytest.fixture
def make_scenario(request: pytest.FixtureRequest, tmp_path: Path, toxi: Toxi, chaos_report: ChaosReport,
                  chaos_seed: int) -> Iterator[Callable[..., Scenario]]:
    made: list[Scenario] = []

    def make(*, retention: bool | dict[str, object] = False, spare: int = 0, entry: str = "broker",
             tls: bool = False, acl: bool = False, raft_settings: dict[str, object] | None = None,
             **options: object) -> Scenario:
        """``retention``: True for RETENTION, or a dict of [raft] settings over it; ``spare``:
        nodes laid out to be added to the group; ``entry``: the module the nodes run;
        ``tls``: the client ports serve TLS; ``acl``: users and ACLs on, the workload's
        clients authenticate (``ChaosBrokers``); ``raft_settings``: [raft] settings over
        the defaults (e.g. election timeouts being measured)."""
        raft = {**RETENTION, **(retention if isinstance(retention, dict) else {})} if retention else None
        if raft_settings:
            raft = {**(raft or {}), **raft_settings}
        brokers = ChaosBrokers(tmp_path / f"brokers{len(made)}", toxi, raft, spare=spare, entry=entry,
                               tls=tls, acl=acl)
        if retention:
            options.setdefault("pad", 1000)  # bigger messages: segments fill, retention deletes
            brokers.expected_log += BEHIND_RETAINED_START  # a replica behind it waits for a snapshot
        name = request.node.name.removeprefix("test_")
        scenario = Scenario(name, chaos_seed, tmp_path / f"work{len(made)}", brokers, chaos_report,
                            **options)  # type: ignore[arg-type]
        made.append(scenario)
        return scenario

    yield make
    for scenario in made:
        try:
            scenario.workload.close()
        finally:
            scenario.brokers.stop()
        scenario.record_unfinished("the test stopped before finish()")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    report = config.stash.get(_REPORT_KEY, None)
    if report is None or not report.rows:
        return
    terminalreporter.section("chaos figures")
    terminalreporter.write_line(f"command: {report.command}")
    terminalreporter.write_line(report.markdown())
    terminalreporter.write_line(f"report: {report.directory / 'chaos-report.json'} and chaos-report.md")
