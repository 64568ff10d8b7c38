"""``Edge``: what every RocketMQ request family's handlers share -- the broker's one dispatch
of RaftMQ frames (``call``: a typed RaftMQ request in, its answer frame out), this broker's
address as RocketMQ names it (``store_host``: it goes into every message id it hands out),
and the subscriptions consumer groups announced in their heartbeats (a push consumer's
pulls do not repeat their filter: the broker looks it up by group and topic, as RocketMQ's
``ConsumerManager`` does).

Threads: the server's event loop only.
"""

from __future__ import annotations

from collections import OrderedDict

from broker.rocketmq.context import RocketBroker
from broker.rocketmq.translate import host_port
from broker.security.authorizer import Need
from protocol.remoting import Frame
from protocol.rocketmq.codes import RequestCode as RocketCode
from protocol.wire import Request

__all__ = ["MAX_SUBSCRIPTIONS", "Edge", "Subscription"]

#: (group, topic) subscriptions remembered from heartbeats; the oldest forgotten beyond it
MAX_SUBSCRIPTIONS = 65_536

Subscription = tuple[str, str]  # (expression type: TAG or SQL92, expression)


class Edge:
    def __init__(self, broker: RocketBroker, listen: str) -> None:
        self.broker = broker
        self._listen = listen
        self._subscriptions: OrderedDict[tuple[str, str], Subscription] = OrderedDict()

    async def call(self, request: Request) -> Frame:
        """``request`` served as if it came on the native port (its answer, never raises)."""
        return await self.broker.handle(request.to_frame(1))

    def require(self, need: Need, code: int) -> None:
        """For a code answered from state directly, not through ``call``: FrameError
        NO_PERMISSION (audited) unless the request's user may ``need`` -- the check ``call``
        makes for a native request. Nothing when ACLs are off."""
        try:
            name = RocketCode(code).name
        except ValueError:
            name = str(code)
        self.broker.access.require(need, f"RocketMQ {name}")

    def store_host(self) -> tuple[str, int]:
        """This replica's client address (the one the routes name): message ids carry it."""
        node = self.broker.rlog.config.node
        return host_port(self.broker.addresses.get(node) or self._listen)

    def subscribed(self, group: str, topic: str, expression: Subscription) -> None:
        key = (group, topic)
        self._subscriptions[key] = expression
        self._subscriptions.move_to_end(key)
        while len(self._subscriptions) > MAX_SUBSCRIPTIONS:
            self._subscriptions.popitem(last=False)

    def subscription(self, group: str, topic: str) -> Subscription | None:
        return self._subscriptions.get((group, topic))
