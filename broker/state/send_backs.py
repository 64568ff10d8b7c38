"""Send-backs seen: a retry or dead-letter copy of one message by one group is stored once
within SENT_BACK_WINDOW_MS of store time (replicated state).

A copy carries ``__SENT_BACK`` = "group:position" (``broker.state.held``); a consumer that
retried its send-back after an unknown outcome must not get the message twice. The value is
kept as the leader wrote it: it is only ever compared whole.

Checkpoint form: ``{"group:position": store ms of the copy stored}``.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["SENT_BACK_WINDOW_MS", "SendBacks"]

#: A consumer retries its send-back only within seconds.
SENT_BACK_WINDOW_MS = 60_000


class SendBacks:
    """Apply thread only."""

    def __init__(self, state: Mapping[str, int] | None = None) -> None:
        self._stored_ms: dict[str, int] = dict(state or {})

    def admit(self, origin: str, stamp: int) -> bool:
        """True (and remembered) unless a copy of ``origin`` was stored within the window
        before store time ``stamp``."""
        seen = self._stored_ms.get(origin)
        if seen is not None and seen >= stamp - SENT_BACK_WINDOW_MS:
            return False
        self._stored_ms[origin] = stamp
        return True

    def forget_expired(self, now_ms: int) -> None:
        for origin in [o for o, ms in self._stored_ms.items() if ms < now_ms - SENT_BACK_WINDOW_MS]:
            del self._stored_ms[origin]

    def state(self) -> dict[str, int]:
        return self._stored_ms
