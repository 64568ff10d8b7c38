"""PULL_MESSAGE (RocketMQ's PullMessageProcessor) at the edge: one RaftMQ pull of the queue
(long poll included: ``suspendTimeoutMillis`` when the SUSPEND flag is set, at most 30 s),
its records' messages from the offset asked for, filtered, as RocketMQ stored messages
(``protocol.rocketmq.message``), at most ``maxMsgNums``.

The filter is the pull's ``subscription`` when it carries one (pull and lite pull
consumers), else the one the group's heartbeat announced for the topic (push consumers):
TAG expressions (``a || b``, ``*``) become RaftMQ's tag hashes, SQL92 is passed on. A page
whose messages the filter all left out answers PULL_RETRY_IMMEDIATELY with the next offset
(RocketMQ's "no matched message"), so the client pulls again from there at once.

The page's records are decoded where the native SQL92 pull reads properties: on an
inflating thread when one is compressed, and only until they decompressed
``MAX_INFLATED_PER_PULL`` (``broker.store.inflation``; the first record always goes); the
answer's next offset is the record it stopped before, so the client pulls on from there.

A pull's ``commitOffset`` (the COMMIT_OFFSET flag) is committed through the log on the
leader when it moved, without holding the pull up; followers leave it to the client's
UPDATE_CONSUMER_OFFSET. ``suggestWhichBrokerId`` is always 0 (the group's leader).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict

from broker.rocketmq.answers import refused, rocket_code
from broker.rocketmq.client_link import RocketClient
from broker.rocketmq.edge import Edge, Subscription
from broker.rocketmq.translate import stored_message
from broker.store.inflation import MAX_INFLATED_PER_PULL, inflate
from protocol.offset import CommitOffsetRequest
from protocol.pull import MAX_PULL, MAX_SUSPEND_MS, PullRequest, PullResponse, PullRow
from protocol.query import SearchOffsetRequest, SearchOffsetResponse
from protocol.record_batch import MessageFormatError, read_header
from protocol.remoting import Frame
from protocol.remoting import ResponseCode as Native
from protocol.rocketmq.codes import PullSysFlag, ResponseCode
from protocol.rocketmq.frame import RemotingFrame
from protocol.rocketmq.headers import PullMessageRequestHeader, PullMessageResponseHeader, reply
from protocol.rocketmq.message import encode_stored
from protocol.tags import tag_hash

__all__ = ["MAX_COMMITS_REMEMBERED", "PullHandlers", "tag_filter"]

log = logging.getLogger("broker.rocketmq")

#: (group, topic, queue) -> last offset committed from a pull; the oldest forgotten beyond it
MAX_COMMITS_REMEMBERED = 65_536


def tag_filter(subscription: Subscription | None) -> tuple[frozenset[str] | None, str | None]:
    """(tags wanted or None for all, SQL92 or None) of a subscription."""
    if subscription is None:
        return None, None
    kind, expression = subscription
    if kind.upper() == "SQL92":
        return None, expression
    tags = frozenset(t.strip() for t in expression.split("||") if t.strip())
    return (None if not tags or "*" in tags else tags), None


class PullHandlers:
    def __init__(self, edge: Edge) -> None:
        self._edge = edge
        self._committed: OrderedDict[tuple[str, str, int], int] = OrderedDict()
        self._commits: set[asyncio.Task[None]] = set()

    async def pull(self, conn: RocketClient, frame: RemotingFrame) -> RemotingFrame:
        h = PullMessageRequestHeader.of(frame)
        subscription = self._edge.subscription(h.consumer_group, h.topic)
        if h.sys_flag & PullSysFlag.SUBSCRIPTION and h.subscription:
            subscription = (h.expression_type or "TAG", h.subscription)
        if subscription is None:  # as RocketMQ's broker: never serve a group unfiltered by guess
            return frame.response(ResponseCode.SUBSCRIPTION_NOT_EXIST, remark=(
                f"RaftMQ: no subscription of group {h.consumer_group!r} to {h.topic!r} on this broker "
                "(the pull carries none and no heartbeat named one)"))
        tags, sql = tag_filter(subscription)
        if h.sys_flag & PullSysFlag.COMMIT_OFFSET and h.commit_offset >= 0:
            self._commit(h.consumer_group, h.topic, h.queue_id, h.commit_offset)
        suspend = 0
        if h.sys_flag & PullSysFlag.SUSPEND:
            suspend = min(max(h.suspend_timeout_millis, 0), MAX_SUSPEND_MS)
        wanted = min(max(h.max_msg_nums, 1), MAX_PULL)
        hashes = None if tags is None else tuple(tag_hash(t) for t in sorted(tags))
        request = PullRequest(topic=h.topic, queue_id=h.queue_id, offset=max(h.queue_offset, 0),
                              max_msgs=wanted, suspend_ms=suspend, tag_hashes=hashes, sql=sql)
        answer = await self._edge.call(request)
        if answer.code not in (Native.SUCCESS, Native.PULL_NOT_FOUND, Native.PULL_OFFSET_MOVED):
            return refused(frame, answer)
        page = PullResponse.from_frame(answer)
        low, high = await self._bounds(h.topic, h.queue_id, page)
        if answer.code != Native.SUCCESS:
            return self._answer(frame, rocket_code(answer.code), page.next_offset, low, high)
        host = self._edge.store_host()
        if any(_compressed(row) for row in page.rows or ()):  # inflates: off the event loop
            body, next_offset = await inflate(_messages, page, request.offset, wanted, tags, host)
        else:
            body, next_offset = _messages(page, request.offset, wanted, tags, host)
        if not body:
            return self._answer(frame, ResponseCode.PULL_RETRY_IMMEDIATELY, next_offset, low, high)
        return self._answer(frame, ResponseCode.SUCCESS, next_offset, low, high, body)

    async def _bounds(self, topic: str, queue_id: int, page: PullResponse) -> tuple[int, int]:
        answer = await self._edge.call(SearchOffsetRequest(topic=topic, queue_id=queue_id))
        if answer.code != Native.SUCCESS:
            return page.min_offset or 0, page.max_offset or page.next_offset
        found = SearchOffsetResponse.from_frame(answer)
        return found.min_offset, found.max_offset

    @staticmethod
    def _answer(frame: RemotingFrame, code: ResponseCode, next_offset: int, low: int, high: int,
                body: bytes = b"") -> RemotingFrame:
        header = PullMessageResponseHeader(suggest_which_broker_id=0, next_begin_offset=next_offset,
                                           min_offset=low, max_offset=high)
        return reply(frame, code, header, body)

    def _commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        key = (group, topic, queue_id)
        if not self._edge.broker.rlog.is_leader or self._committed.get(key) == offset:
            return
        self._committed[key] = offset
        self._committed.move_to_end(key)
        while len(self._committed) > MAX_COMMITS_REMEMBERED:
            self._committed.popitem(last=False)
        task = asyncio.get_running_loop().create_task(self._commit_through_log(key, offset))
        self._commits.add(task)
        task.add_done_callback(self._commits.discard)

    async def _commit_through_log(self, key: tuple[str, str, int], offset: int) -> None:
        group, topic, queue_id = key
        answer: Frame = await self._edge.call(CommitOffsetRequest(group=group, topic=topic, queue_id=queue_id,
                                                                  offset=offset))
        if answer.code != Native.SUCCESS:
            self._committed.pop(key, None)  # the next pull tries again


def _compressed(row: PullRow) -> bool:
    try:
        return bool(read_header(row.record).codec)
    except MessageFormatError:
        return False


def _messages(page: PullResponse, offset: int, wanted: int, tags: frozenset[str] | None,
              host: tuple[str, int]) -> tuple[bytes, int]:
    """The stored messages of ``page`` from ``offset`` (filtered, at most ``wanted``) and where
    the next pull starts: before the first record that would take what it decompressed past
    MAX_INFLATED_PER_PULL (the first record always goes). Any thread: an inflating one
    when a record is compressed."""
    out: list[bytes] = []
    inflated = 0
    for row in page.rows or ():
        try:
            header = read_header(row.record)
            raw = header.raw_length if header.codec else 0
            if inflated and inflated + raw > MAX_INFLATED_PER_PULL:  # the rest next pull
                return b"".join(out), max(row.offset, offset)
            inflated += raw
            messages = row.messages()
        except MessageFormatError as e:
            log.warning("a pulled record at offset %d cannot be read: %s", row.offset, e)
            continue
        for i, m in enumerate(messages):
            queue_offset = row.offset + i
            if queue_offset < offset:
                continue
            if len(out) >= wanted:
                return b"".join(out), queue_offset
            if row.selected is not None and i not in row.selected:
                continue
            if tags is not None and m.tags not in tags:
                continue
            out.append(encode_stored(stored_message(m, queue_offset=queue_offset, position=row.position + i,
                                                    store_ms=row.store_ms, store_host=host)))
    return b"".join(out), page.next_offset
