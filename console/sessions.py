"""The console's sessions: who is signed in on each browser, and the token that proves a
request came from the console's own page.

    sessions = Sessions(idle_s=1800, absolute_s=43200)
    s = sessions.open()                    an anonymous session: a random id (the cookie) and
                                           a random CSRF token (the page reads it from
                                           /api/whoami and sends it as X-CSRF-Token)
    s = sessions.sign_in(s.id, creds)      a NEW id and token at sign-in (the pre-login id
                                           names nothing afterwards: no session fixation)
    sessions.get(id)                       the session, None once idle for idle_s or older
                                           than absolute_s (OWASP's idle and absolute timeouts)

At most ``max_sessions`` are held: opening one more forgets the least recently used.
Event loop only.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from client.credentials import Credentials

__all__ = ["ABSOLUTE_S", "IDLE_S", "Session", "Sessions"]

IDLE_S = 30 * 60.0
ABSOLUTE_S = 12 * 3600.0
MAX_SESSIONS = 10_000


@dataclass(slots=True)
class Session:
    id: str
    csrf: str
    credentials: Credentials | None
    created: float
    used: float

    def csrf_ok(self, token: str | None) -> bool:
        """Whether ``token`` is this session's CSRF token (compared in constant time)."""
        return bool(token) and hmac.compare_digest(str(token).encode(), self.csrf.encode())


class Sessions:
    def __init__(self, idle_s: float = IDLE_S, absolute_s: float = ABSOLUTE_S,
                 clock: Callable[[], float] = time.monotonic, max_sessions: int = MAX_SESSIONS) -> None:
        self.idle_s = idle_s
        self.absolute_s = absolute_s
        self._clock = clock
        self._max = max_sessions
        self._held: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def open(self, credentials: Credentials | None = None) -> Session:
        now = self._clock()
        while len(self._held) >= self._max:
            self._held.popitem(last=False)
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), credentials, now, now)
        self._held[session.id] = session
        return session

    def get(self, sid: str | None) -> Session | None:
        """The live session ``sid`` names (its idle time starts again), else None."""
        session = self._held.get(sid or "")
        if session is None:
            return None
        now = self._clock()
        if now - session.used > self.idle_s or now - session.created > self.absolute_s:
            del self._held[session.id]
            return None
        session.used = now
        self._held.move_to_end(session.id)
        return session

    def sign_in(self, sid: str | None, credentials: Credentials) -> Session:
        """A new session of ``credentials`` replacing ``sid``'s (which then names nothing)."""
        self.close(sid)
        return self.open(credentials)

    def close(self, sid: str | None) -> None:
        self._held.pop(sid or "", None)
