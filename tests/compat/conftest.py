"""Fixtures of tests/compat: the harnesses built, and one target per test module (a fresh
RaftMQ cluster, or the real RocketMQ with COMPAT_TARGET=reference: see targets.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.compat.harness import classpath
from tests.compat.targets import TARGET, Target, raftmq_target, reference_target

#: the reference RocketMQ runs without ACLs: the AK/SK test is RaftMQ's alone (not collected there)
collect_ignore = ["test_java_acl.py"] if TARGET == "reference" else []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "compat: real RocketMQ clients (Java, Go, mqadmin) against RaftMQ")


@pytest.fixture(scope="session")
def harness_built() -> str:
    """The harness's classpath; a test fails (never skips) when it is not built."""
    return classpath()


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, harness_built: str) -> Iterator[Target]:
    """One target per test module: RaftMQ (a fresh cluster) or the reference RocketMQ."""
    base = tmp_path_factory.mktemp("compat")
    if TARGET == "reference":
        yield from reference_target(base / "java")
    elif TARGET == "raftmq":
        yield from raftmq_target(base)
    else:
        raise ValueError(f"COMPAT_TARGET={TARGET!r}: 'raftmq' or 'reference'")
