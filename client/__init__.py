"""RaftMQ's Python client. Blocking API here; the asyncio API is ``client.aio``.

    from client import Producer, PushConsumer, PullConsumer, Message, ConsumeStatus
    p = Producer(namesrv="127.0.0.1:9876", group="orders-producer").start()
    r = p.send(Message("orders", b"...", tags="paid", keys=["order-42"]), shard_key="order-42")

A cluster serving TLS: ``Producer(..., tls=ClientTls(ca_file="ca.pem"))`` (every class takes
``tls=``; mutual TLS: ``ClientTls(ca_file, cert_file, key_file)``; ``$RAFTMQ_CA_FILE`` when
``tls`` is not given).
"""

from client.aio.simple_consumer import Receipt, SimpleMessage
from client.aio.transaction import LocalTransactionState, TransactionResult
from client.credentials import Credentials
from client.errors import ClientError
from client.message import ConsumeStatus, Message, ReceivedMessage, SendResult, SendStatus
from client.queues import MessageQueue
from client.sync import Admin, Producer, PullConsumer, PushConsumer, SimpleConsumer, TransactionProducer
from protocol.tls import ClientTls

__all__ = [
           "Admin",
           "ClientError",
           "ClientTls",
           "ConsumeStatus",
           "Credentials",
           "LocalTransactionState",
           "Message",
           "MessageQueue",
           "Producer",
           "PullConsumer",
           "PushConsumer",
           "Receipt",
           "ReceivedMessage",
           "SendResult",
           "SendStatus",
           "SimpleConsumer",
           "SimpleMessage",
           "TransactionProducer",
           "TransactionResult",
]
