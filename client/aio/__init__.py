"""The asyncio client (the blocking facade in ``client`` runs these on a background loop)."""

from client.aio.admin import AsyncAdmin, QueueProgress
from client.aio.core import ClientCore
from client.aio.producer import AsyncProducer
from client.aio.pull_consumer import AsyncPullConsumer, PullResult
from client.aio.push_consumer import AsyncPushConsumer, ConsumeContext
from client.aio.simple_consumer import AsyncSimpleConsumer, Receipt, SimpleMessage
from client.aio.transaction import AsyncTransactionProducer, LocalTransactionState, TransactionListener
from protocol.tls import ClientTls

__all__ = ["AsyncAdmin", "AsyncProducer", "AsyncPullConsumer", "AsyncPushConsumer", "AsyncSimpleConsumer",
           "AsyncTransactionProducer", "ClientCore", "ClientTls", "ConsumeContext", "LocalTransactionState",
           "PullResult", "QueueProgress", "Receipt", "SimpleMessage", "TransactionListener"]
