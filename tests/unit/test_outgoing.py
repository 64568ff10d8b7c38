"""client.aio.outgoing: the producer's checks of a message before it is queued."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client.aio.outgoing import check_message, record_size
from client.errors import MessageTooLargeError
from client.message import Message

_TEXT = st.text(max_size=20)


@given(st.builds(Message, topic=st.text(min_size=1, max_size=30), body=st.binary(max_size=200),
                 tags=st.none() | _TEXT, keys=st.lists(_TEXT, max_size=3),
                 properties=st.dictionaries(_TEXT, _TEXT, max_size=3)))
def test_the_check_returns_the_record_size_the_queue_counts(m: Message) -> None:
    assert check_message(m, 1 << 20) == record_size(m)


def test_a_message_over_the_limit_or_of_wrong_types_is_refused_with_the_reason() -> None:
    with pytest.raises(MessageTooLargeError, match="exceeds max_message_bytes=1000"):
        check_message(Message("t", b"x" * 1000), 1000)
    with pytest.raises(TypeError, match="keys must be a sequence of strings"):
        check_message(Message("t", b"x", keys="order-42"), 1000)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="body must be bytes"):
        check_message(Message("t", "text"), 1000)  # type: ignore[arg-type]
