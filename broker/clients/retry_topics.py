"""How many group topics (``%RETRY%group``, ``%DLQ%group``) a user's heartbeats and
send-backs may make a leader create (issue 25, row 6).

A heartbeat naming ``%RETRY%group`` and a send-back create the group's topic as RocketMQ
does, needing only ``sub`` on the group: a user with ``group:m-*`` could make any number.
The leader counts the ones it created for each user that still exist and refuses a new one
past ``MAX_RETRY_TOPICS_PER_USER`` (a deleted one no longer counts: DELETE_TOPIC of a group
topic needs ``update`` on the group). The count is this leader's (a new leader starts from
none). Without ACLs (no user) nothing is counted: anyone may create topics there.
"""

from __future__ import annotations

from collections.abc import Callable, Container

__all__ = ["MAX_RETRY_TOPICS_PER_USER", "RetryQuotaExceeded", "RetryTopicQuota"]

MAX_RETRY_TOPICS_PER_USER = 100


class RetryQuotaExceeded(Exception):
    """A user made MAX_RETRY_TOPICS_PER_USER group topics already."""


class RetryTopicQuota:
    def __init__(self, topics: Callable[[], Container[str]], limit: int = MAX_RETRY_TOPICS_PER_USER) -> None:
        self._topics = topics
        self.limit = limit
        self._made: dict[str, set[str]] = {}

    def take(self, user: str | None, wanted: list[str]) -> None:
        """Count ``wanted`` (topics about to be created) as ``user``'s; RetryQuotaExceeded,
        counting none of them, if that would pass the limit."""
        if user is None or not wanted:
            return
        existing = self._topics()
        made = {t for t in self._made.get(user, ()) if t in existing}
        new = set(wanted) - made
        if len(made) + len(new) > self.limit:
            raise RetryQuotaExceeded(
                f"user {user!r} made {len(made)} retry topics (%RETRY%/%DLQ% of its groups) on this "
                f"leader, {self.limit} retry topics at most: delete unused ones (DELETE_TOPIC, update on "
                "the group) or ask an operator")
        self._made[user] = made | new
