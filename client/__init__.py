"""RaftMQ's Python client. Blocking API here; the asyncio API is ``client.aio``.

    from client import Producer, PushConsumer, PullConsumer, Message, ConsumeStatus
    p = Producer(namesrv="127.0.0.1:9876", group="orders-producer").start()
    r = p.send(Message("orders", b"...", tags="paid", keys=["order-42"]), shard_key="order-42")
"""

from client.aio.transaction import LocalTransactionState, TransactionResult
from client.credentials import Credentials
from client.errors import ClientError
from client.message import ConsumeStatus, Message, ReceivedMessage, SendResult, SendStatus
from client.queues import MessageQueue
from client.sync import Admin, Producer, PullConsumer, PushConsumer, TransactionProducer

__all__ = [
           "Admin",
           "ClientError",
           "ConsumeStatus",
           "Credentials",
           "LocalTransactionState",
           "Message",
           "MessageQueue",
           "Producer",
           "PullConsumer",
           "PushConsumer",
           "ReceivedMessage",
           "SendResult",
           "SendStatus",
           "TransactionProducer",
           "TransactionResult",
]
