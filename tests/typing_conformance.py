"""Checked by mypy (scripts/test, ``[tool.mypy]`` in pyproject.toml), never run: the concrete
classes satisfy the protocols the layers are written against -- both logs are a ``Log``
(their CommitLog the ``LogReader`` they hand out), and the broker server is the
``BrokerContext`` its processors see and the ``AccessServer`` access control reads. A member
renamed or retyped on one side fails the type check here, by name."""

from __future__ import annotations

from broker.http_api.metrics import BrokerMetrics
from broker.http_api.server_view import ServerView
from broker.processors.context import BrokerContext, ProcessorMetrics
from broker.remoting.server import BrokerServer
from broker.rocketmq.context import RocketBroker
from broker.security.access_control import AccessServer
from dledger.local_log import LocalLog
from dledger.log import Log
from dledger.log_reader import LogReader
from dledger.raft.replicated_log import ReplicatedLog
from dledger.storage.commitlog import CommitLog
from tests.support.memory_broker import MemoryBroker


def memory_log_is_a_log(log: LocalLog) -> Log:
    return log


def replicated_log_is_a_log(log: ReplicatedLog) -> Log:
    return log


def commitlog_is_a_log_reader(commitlog: CommitLog) -> LogReader:
    return commitlog


def server_is_a_context(server: BrokerServer) -> BrokerContext:
    return server


def metrics_feed_processors(metrics: BrokerMetrics) -> ProcessorMetrics:
    return metrics


def server_is_what_access_control_reads(server: BrokerServer) -> AccessServer:
    return server


def server_is_what_the_http_endpoints_read(server: BrokerServer) -> ServerView:
    return server


def server_is_what_the_rocketmq_front_end_reads(server: BrokerServer) -> RocketBroker:
    return server


def the_memory_broker_is_a_context(broker: MemoryBroker) -> BrokerContext:
    return broker  # the processor tests' context (tests/support/memory_broker.py)
