"""Console sessions (issue 25, row 4): a new id at sign-in, an idle and an absolute lifetime,
a CSRF token per session compared in constant time."""

from __future__ import annotations

from client.credentials import Credentials
from console.sessions import Sessions


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_sign_in_gives_a_new_session_id() -> None:
    sessions = Sessions(idle_s=60, absolute_s=3600, clock=Clock())
    before = sessions.open()
    after = sessions.sign_in(before.id, Credentials("alice", "pw"))
    assert after.id != before.id and after.credentials == Credentials("alice", "pw")
    assert sessions.get(before.id) is None, "the pre-login id still names a session"
    assert after.csrf != before.csrf


def test_sessions_end_when_idle_and_at_their_absolute_lifetime() -> None:
    clock = Clock()
    sessions = Sessions(idle_s=60, absolute_s=300, clock=clock)
    s = sessions.sign_in(sessions.open().id, Credentials("alice", "pw"))
    clock.now += 59
    assert sessions.get(s.id) is not None  # used: its idle time starts again
    clock.now += 61
    assert sessions.get(s.id) is None
    s = sessions.sign_in(sessions.open().id, Credentials("alice", "pw"))
    for _ in range(10):  # kept busy, it still ends
        clock.now += 31
        sessions.get(s.id)
    assert sessions.get(s.id) is None


def test_csrf_tokens_are_per_session() -> None:
    sessions = Sessions(idle_s=60, absolute_s=300, clock=Clock())
    a, b = sessions.open(), sessions.open()
    assert a.csrf_ok(a.csrf) and not a.csrf_ok(b.csrf) and not a.csrf_ok("") and not a.csrf_ok(None)


def test_the_number_of_sessions_is_bounded() -> None:
    sessions = Sessions(idle_s=60, absolute_s=300, clock=Clock(), max_sessions=10)
    ids = [sessions.open().id for _ in range(25)]
    assert len(sessions) <= 10 and sessions.get(ids[-1]) is not None
