"""Topic and group names: RocketMQ's character set, lengths and reserved names."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.names import (
    GROUP_MAX_LENGTH,
    TOPIC_MAX_LENGTH,
    InvalidName,
    dlq_topic,
    is_reserved_topic,
    retry_topic,
    validate_group,
    validate_topic,
)

ALLOWED = "letters, digits, '_', '-', '%', '|'"

GOOD_TOPICS = [
    "a", "TopicTest", "order-events_v2", "a|b", "50%off", "0", "-", "_",
    "x" * TOPIC_MAX_LENGTH, "RETRY", "DLQ", "rmq_sysx", "RMQ_SYS", "SCHEDULE_TOPIC_XXXXY",
    "a%RETRY%",
]


@pytest.mark.parametrize("name", GOOD_TOPICS)
def test_valid_topics_are_returned_unchanged(name: str) -> None:
    assert validate_topic(name) == name
    assert validate_topic(name, system=True) == name


@pytest.mark.parametrize(("name", "fragments"), [
    ("", ["topic name is empty", f"1 to {TOPIC_MAX_LENGTH}", ALLOWED]),
    ("a b", [f"topic 'a b' contains ' ' at position 1; allowed: {ALLOWED}"]),
    ("topic.name", ["contains '.' at position 5"]),
    ("a/b", ["contains '/' at position 1"]),
    ("ab\n", ["contains '\\n' at position 2"]),
    ("caf\u00e9", ["contains '\u00e9' at position 3"]),
    ("\u0661", ["contains '\u0661' at position 0"]),  # a unicode digit is not a digit here
    ("x" * (TOPIC_MAX_LENGTH + 1), [f"is {TOPIC_MAX_LENGTH + 1} characters long",
                                     f"at most {TOPIC_MAX_LENGTH}"]),
    ("%RETRY%g", ["reserved prefix '%RETRY%'", "retry topics", "choose another name"]),
    ("%DLQ%g", ["reserved prefix '%DLQ%'", "dead-letter"]),
    ("SCHEDULE_TOPIC_XXXX", ["'SCHEDULE_TOPIC_XXXX' is reserved", "delayed-message"]),
    ("RMQ_SYS_TRANS_HALF_TOPIC", ["is reserved", "half-message"]),
    ("RMQ_SYS_TRANS_OP_HALF_TOPIC", ["is reserved", "op topic"]),
    ("rmq_sys_trace", ["reserved prefix 'rmq_sys_'", "system topics"]),
    ("RMQ_SYS_anything", ["reserved prefix 'RMQ_SYS_'"]),
])
def test_invalid_user_topics(name: str, fragments: list[str]) -> None:
    assert_invalid(validate_topic, "topic", name, fragments)


def assert_invalid(validate: Callable[[str], str], kind: str, name: str, fragments: list[str]) -> None:
    """``validate(name)`` raises an InvalidName of ``kind`` naming ``name``, with every fragment."""
    with pytest.raises(InvalidName) as caught:
        validate(name)
    for fragment in fragments:
        assert fragment in str(caught.value)
    assert (caught.value.kind, caught.value.name) == (kind, name)


@pytest.mark.parametrize("name", [
    "%RETRY%g", "%DLQ%g", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC", "rmq_sys_trace", "%RETRY%" + "g" * GROUP_MAX_LENGTH,
])
def test_system_topics_are_allowed_for_the_broker(name: str) -> None:
    assert is_reserved_topic(name)
    assert validate_topic(name, system=True) == name


@pytest.mark.parametrize(("name", "fragment"), [
    ("%RETRY%", "names no group after its prefix"),
    ("%DLQ%", "names no group after its prefix"),
    ("%RETRY%" + "g" * (GROUP_MAX_LENGTH + 1), f"at most {len('%RETRY%') + GROUP_MAX_LENGTH}"),
    ("%DLQ%a b", "contains ' ' at position 6"),
    ("rmq_sys_" + "x" * TOPIC_MAX_LENGTH, f"at most {TOPIC_MAX_LENGTH}"),
    ("RMQ_SYS_a.b", "contains '.'"),
])
def test_system_topics_still_follow_the_shape_rules(name: str, fragment: str) -> None:
    with pytest.raises(InvalidName) as caught:
        validate_topic(name, system=True)
    assert fragment in str(caught.value)


@pytest.mark.parametrize("name", ["g", "CID_orders", "x" * GROUP_MAX_LENGTH, "%RETRY%g", "a|b%c"])
def test_valid_groups(name: str) -> None:
    assert validate_group(name) == name


@pytest.mark.parametrize(("name", "fragments"), [
    ("", ["group name is empty", f"1 to {GROUP_MAX_LENGTH}"]),
    ("x" * (GROUP_MAX_LENGTH + 1), [f"is {GROUP_MAX_LENGTH + 1} characters long",
                                     f"at most {GROUP_MAX_LENGTH}", "'xxxxx", "..."]),
    ("my group", [f"group 'my group' contains ' ' at position 2; allowed: {ALLOWED}"]),
    ("g\x00", ["contains '\\x00' at position 1"]),
])
def test_invalid_groups(name: str, fragments: list[str]) -> None:
    assert_invalid(validate_group, "group", name, fragments)


@pytest.mark.parametrize("value", [None, 5, b"topic", ["t"]])
def test_non_strings_are_invalid_names(value: object) -> None:
    with pytest.raises(InvalidName, match="topic name must be a str"):
        validate_topic(value)  # type: ignore[arg-type]
    with pytest.raises(InvalidName, match="group name must be a str"):
        validate_group(value)  # type: ignore[arg-type]


def test_retry_and_dlq_topics() -> None:
    assert retry_topic("cg") == "%RETRY%cg"
    assert dlq_topic("cg") == "%DLQ%cg"
    long_group = "g" * GROUP_MAX_LENGTH
    assert validate_topic(retry_topic(long_group), system=True) == "%RETRY%" + long_group
    assert validate_topic(dlq_topic(long_group), system=True) == "%DLQ%" + long_group
    with pytest.raises(InvalidName, match="group 'a b'"):
        retry_topic("a b")
    with pytest.raises(InvalidName, match="group name is empty"):
        dlq_topic("")


def test_invalid_name_is_a_value_error() -> None:
    assert issubclass(InvalidName, ValueError)


@settings(max_examples=200)
@given(st.text(max_size=140))
def test_matches_rocketmq_pattern(name: str) -> None:
    """The character and length rules are exactly ^[%|a-zA-Z0-9_-]+$ with the length cap."""
    expected = (re.fullmatch(r"[%|a-zA-Z0-9_-]+", name) is not None
                and len(name) <= TOPIC_MAX_LENGTH)
    try:
        validate_topic(name, system=True)
        accepted = True
    except InvalidName:
        accepted = False
    if not name.startswith(("%RETRY%", "%DLQ%")):  # those have the group's length cap
        assert accepted == expected
