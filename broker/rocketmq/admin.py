"""The broker codes mqadmin sends beyond the clients' (RocketMQ's AdminBrokerProcessor):

    GET_TOPIC_STATS_INFO   (topicStatus)       every queue's min and max offset (SEARCH_OFFSET)
                                               and the store time of its last message (a pull)
    GET_CONSUME_STATS      (consumerProgress)  a group's committed offset beside each queue's
                                               end, from the broker's lag rows; lastTimestamp
                                               the store time of the last message consumed
    GET_BROKER_RUNTIME_INFO (clusterList)      a few of RocketMQ's runtime keys: the version
                                               ("RaftMQ"), boot time, CommitLog bounds, the
                                               disk's use; put/get TPS are not measured here
                                               (0.0: RaftMQ's rates are in /metrics)

Each queue is named with this group's broker name (``MessageQueue``: topic, group, queue id).
"""

from __future__ import annotations

import shutil
import time

from broker.rocketmq.answers import refused
from broker.rocketmq.client_link import RocketClient
from broker.rocketmq.edge import Edge
from broker.security.authorizer import Need
from protocol.acl import Action, ResourceType
from protocol.pull import PullRequest, PullResponse
from protocol.query import SearchOffsetRequest, SearchOffsetResponse
from protocol.remoting import ResponseCode as Native
from protocol.rocketmq.bodies import MessageQueue, QueueStats, consume_stats, kv_table, topic_stats
from protocol.rocketmq.codes import ResponseCode
from protocol.rocketmq.frame import RemotingFrame
from protocol.rocketmq.headers import GetConsumeStatsRequestHeader, GetTopicStatsInfoRequestHeader, reply
from protocol.topic import GetTopicsRequest, TopicsResponse

__all__ = ["AdminHandlers"]


class AdminHandlers:
    def __init__(self, edge: Edge) -> None:
        self._edge = edge
        self._booted_ms = int(time.time() * 1000)

    @property
    def _broker_name(self) -> str:
        return self._edge.broker.rlog.config.group

    async def _stored_ms(self, topic: str, queue_id: int, offset: int) -> int:
        """The store time of the message at ``offset`` (0: none)."""
        if offset < 0:
            return 0
        answer = await self._edge.call(PullRequest(topic=topic, queue_id=queue_id, offset=offset, max_msgs=1))
        if answer.code != Native.SUCCESS:
            return 0
        rows = PullResponse.from_frame(answer).rows or ()
        return rows[0].store_ms if rows else 0

    async def topic_stats(self, conn: RocketClient, frame: RemotingFrame) -> RemotingFrame:
        topic = GetTopicStatsInfoRequestHeader.of(frame).topic
        answer = await self._edge.call(GetTopicsRequest())
        if answer.code != Native.SUCCESS:
            return refused(frame, answer)
        config = TopicsResponse.from_frame(answer).topics.get(topic)
        if config is None:
            return frame.response(ResponseCode.TOPIC_NOT_EXIST,
                                  remark=f"RaftMQ: topic {topic!r} does not exist")
        rows = []
        for queue_id in range(config.queues):
            found = await self._edge.call(SearchOffsetRequest(topic=topic, queue_id=queue_id))
            if found.code != Native.SUCCESS:
                return refused(frame, found)
            bounds = SearchOffsetResponse.from_frame(found)
            last = await self._stored_ms(topic, queue_id, bounds.max_offset - 1)
            rows.append(QueueStats(MessageQueue(topic, self._broker_name, queue_id), bounds.min_offset,
                                   bounds.max_offset, last))
        return reply(frame, ResponseCode.SUCCESS, body=topic_stats(rows))

    async def consume_stats(self, conn: RocketClient, frame: RemotingFrame) -> RemotingFrame:
        h = GetConsumeStatsRequestHeader.of(frame)
        self._edge.require(Need(ResourceType.GROUP, h.consumer_group, (Action.GET,)), frame.code)  # offsets
        rows = []
        for row in self._edge.broker.lag_rows(h.consumer_group):
            topic, queue_id = str(row["topic"]), int(row["queue"])  # type: ignore[call-overload]
            if h.topic and topic != h.topic:
                continue
            committed = int(row["committed"])  # type: ignore[call-overload]
            last = await self._stored_ms(topic, queue_id, committed - 1)
            rows.append(QueueStats(MessageQueue(topic, self._broker_name, queue_id),
                                   int(row["min_offset"]), int(row["max_offset"]),  # type: ignore[call-overload]
                                   last, committed))
        return reply(frame, ResponseCode.SUCCESS, body=consume_stats(rows))

    async def runtime_info(self, conn: RocketClient, frame: RemotingFrame) -> RemotingFrame:
        self._edge.require(Need(ResourceType.CLUSTER, "", (Action.GET,)), frame.code)  # as /admin/cluster
        rlog = self._edge.broker.rlog
        usage = shutil.disk_usage(rlog.config.data_dir)
        table = {
            "brokerVersionDesc": "RaftMQ", "bootTimestamp": str(self._booted_ms),
            "commitLogMinOffset": str(rlog.commitlog.start_position),
            "commitLogMaxOffset": str(rlog.commitlog.write_position),
            "commitLogDiskRatio": f"{(usage.total - usage.free) / max(usage.total, 1):.4f}",
            "putTps": "0.0", "getTransferedTps": "0.0", "sendThreadPoolQueueSize": "0",
            "pullThreadPoolQueueSize": "0", "sendThreadPoolQueueHeadWaitTimeMills": "0",
            "pullThreadPoolQueueHeadWaitTimeMills": "0", "pageCacheLockTimeMills": "0",
            "earliestMessageTimeStamp": "", "brokerRole": "ASYNC_MASTER" if rlog.is_leader else "SLAVE",
        }
        return reply(frame, ResponseCode.SUCCESS, body=kv_table(table))
