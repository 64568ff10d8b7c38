"""``fetch`` skips messages a replica says retention deleted only when the leader agrees.

A replica's "offset moved forward" (PULL_OFFSET_MOVED with a next offset beyond the one
asked for) means the messages are gone for good, and a consumer that believes it skips
them. One replica's word is not enough: a replica whose CommitLog was cut by repair once
said so of 80 acknowledged messages it merely did not hold yet (the chaos suite's
disk-loss test), and the consumer skipped them. ``fetch`` then pulls from the leader, whose
answer stands: it skips only what the leader no longer holds either.
"""

from __future__ import annotations

import asyncio
from typing import Any

from client.aio.pull_consumer import fetch
from client.errors import ClientError
from client.queues import MessageQueue
from protocol.pull import PullRequest, PullResponse
from protocol.remoting import Frame, ResponseCode
from protocol.wire import Request

QUEUE = MessageQueue("t", "g1", 0)


class MovedCore:
    """A follower answering every pull with PULL_OFFSET_MOVED to ``moved_to``; the leader
    holding the queue from ``leader_min`` (None: the leader cannot be reached)."""

    request_timeout = 3.0

    def __init__(self, moved_to: int, leader_min: int | None) -> None:
        self.moved_to, self.leader_min = moved_to, leader_min
        self.asked: list[str] = []

    async def read_request(self, group: str, request: Request, *, read_from: str = "follower",
                           affinity: str = "", timeout: float | None = None,
                           ok: tuple[int, ...] = (0,), hold_s: float | None = None,
                           topic: str | None = None) -> Frame:
        assert isinstance(request, PullRequest)
        frame = request.to_frame(1)
        self.asked.append(read_from)
        if read_from != "leader":
            return PullResponse(next_offset=self.moved_to, min_offset=self.moved_to).reply(
                frame, ResponseCode.PULL_OFFSET_MOVED)
        if self.leader_min is None:
            raise ClientError("no leader")
        if request.offset < self.leader_min:
            return PullResponse(next_offset=self.leader_min, min_offset=self.leader_min).reply(
                frame, ResponseCode.PULL_OFFSET_MOVED)
        return PullResponse(next_offset=request.offset, max_offset=500).reply(
            frame, ResponseCode.PULL_NOT_FOUND)


def _fetch(core: Any, offset: int) -> int:
    return asyncio.run(fetch(core, QUEUE, offset)).next_offset


def test_a_skip_the_leader_does_not_confirm_is_not_taken() -> None:
    core = MovedCore(moved_to=200, leader_min=0)
    assert _fetch(core, 115) == 115
    assert core.asked == ["follower", "leader"]


def test_a_skip_the_leader_confirms_is_taken_as_far_as_the_leader_says() -> None:
    assert _fetch(MovedCore(moved_to=200, leader_min=300), 115) == 300
    assert _fetch(MovedCore(moved_to=200, leader_min=150), 115) == 150


def test_without_a_leader_nothing_is_skipped_yet() -> None:
    assert _fetch(MovedCore(moved_to=200, leader_min=None), 115) == 115


def test_a_lagging_replica_never_moves_the_offset_back() -> None:
    core = MovedCore(moved_to=100, leader_min=0)
    assert _fetch(core, 115) == 115
    assert core.asked == ["follower"]  # nothing to confirm
