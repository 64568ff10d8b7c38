"""A streaming query's progress committed to a consumer group (the source's ``groupId``
option), so that ``raftmq group progress`` and the console show a Spark job's lag.

The query's checkpoint stays the source of truth: the group's offsets are a copy, written
after each micro-batch commits (``commit(end)``), best effort -- a failure is logged and
the query goes on; the next batch's commit writes the newer offsets. Pure asyncio (no
pyspark).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from client.aio.core import ClientCore
from client.backoff import Deadline
from client.errors import ClientError
from protocol.offset import CommitOffsetRequest
from spark.options import SourceOptions

__all__ = ["commit_progress"]

log = logging.getLogger("spark.raftmq")


async def _commit(opts: SourceOptions, group_id: str, offsets: Mapping[tuple[str, str, int], int]) -> None:
    core = ClientCore(**opts.client_args(), request_timeout=opts.request_timeout_s)
    try:
        for (topic, group, queue_id), offset in sorted(offsets.items()):
            request = CommitOffsetRequest(group=group_id, topic=topic, queue_id=queue_id, offset=offset)
            await core.leader_request(group, request, deadline=Deadline(opts.request_timeout_s),
                                      topic=topic)
    finally:
        await core.close()


def commit_progress(opts: SourceOptions, offsets: Mapping[tuple[str, str, int], int]) -> bool:
    """Store ``offsets`` (next offset per (topic, broker group, queue id)) as
    ``opts.group_id``'s committed offsets, each queue's under its own topic; False (and a
    WARNING) if that failed."""
    if opts.group_id is None:
        return True
    try:
        asyncio.run(_commit(opts, opts.group_id, offsets))
        return True
    except (ClientError, OSError) as e:
        log.warning("committing the query's progress to consumer group %r failed (the checkpoint "
                    "holds it; the next batch tries again): %s", opts.group_id, e)
        return False
