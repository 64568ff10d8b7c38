"""``python -m benchmarks.acl``: CPU of the authorization of one request on the broker --
a SEND_BATCH of 64 messages of 256 B (one record, as the producer sends one queue's
messages) and a PULL, by a user whose decision is cached (what every request after a
connection's first costs): the request's needs read from the frame (``broker.security.access_map``:
the records' topics peeked) and looked up (``broker.security.authorizer``).
Best of 5 repeats, one core."""

from __future__ import annotations

import timeit

from broker.security.access_map import needs
from broker.security.authorizer import Principal
from broker.state.access import AccessTables
from broker.store.commands import Grant, PutUser
from protocol.pull import PullRequest
from protocol.record_batch import encode_record
from protocol.remoting import Frame
from protocol.send import SendBatchRequest

__all__ = ["main"]


class _NoPositions:
    """No message at any position (the benchmark's requests name none)."""

    def topic_at(self, position: int) -> str | None:
        return None

    def half_at(self, position: int) -> tuple[str, str] | None:
        return None


def main(requests: int = 20000) -> None:
    """Time ``requests`` PULL checks and a tenth as many SEND_BATCH checks, best of 5."""
    tables = AccessTables()
    tables.apply(PutUser("app", False, b"s" * 16, 4096, b"k" * 32, b"v" * 32))
    tables.apply(Grant("app", "topic:bench", "allow", "", ("pub", "sub")))
    principal = Principal.of("app", "127.0.0.1")
    record = encode_record("bench", 0, [(i.to_bytes(16, "big"), 0, 0, None, (), {}, 0, b"x" * 256)
                                        for i in range(64)])
    batch = SendBatchRequest(records=(record,)).to_frame(1)
    pull = PullRequest(topic="bench", queue_id=0, offset=0).to_frame(2)

    def check(frame: Frame) -> None:
        for need in needs(frame, _NoPositions()):
            assert principal.may(tables, need)

    for name, frame, number, per in (("SEND_BATCH of 64 x 256 B", batch, max(1, requests // 10), 64),
                                ("PULL", pull, requests, 1)):
        best = min(timeit.repeat(lambda f=frame: check(f), number=number, repeat=5)) / number  # type: ignore[misc]
        print(f"{name:26} {best * 1e6:6.1f} us per request, {best * 1e6 / per:5.2f} us per message")


if __name__ == "__main__":
    main()
