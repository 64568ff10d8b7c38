"""The typed ``extFields`` of the RocketMQ requests and responses served (``*RequestHeader``
and ``*ResponseHeader`` of apache/rocketmq 4.9.7's ``common.protocol.header``).

On the wire every field is text: ``Integer``/``Long`` in decimal, ``boolean`` as
``true``/``false``. A header class here lists its fields in the Java class's declaration
order (which is the order Java puts them into its ``HashMap``, so ``to_ext`` writes the
bytes a Java broker would) with their wire names; a field without a default is required
(``@CFNotNull``) and ``from_ext`` refuses a frame lacking it, or holding text that is not
of the field's type, with ``HeaderError`` naming the field.

``SEND_MESSAGE_V2`` carries ``SendMessageRequestHeader``'s fields under one-letter names
(``SendMessageRequestHeaderV2``): ``send_header`` reads either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self, get_type_hints

from protocol.rocketmq.codes import RequestCode
from protocol.rocketmq.frame import RemotingFrame

__all__ = [
    "CheckTransactionStateRequestHeader", "ConsumerSendMsgBackRequestHeader",
    "CreateTopicRequestHeader", "EndTransactionRequestHeader", "GetConsumeStatsRequestHeader",
    "GetConsumerListByGroupRequestHeader", "GetMaxOffsetRequestHeader", "GetRouteInfoRequestHeader",
    "GetTopicStatsInfoRequestHeader", "HeaderError", "NotifyConsumerIdsChangedRequestHeader",
    "OffsetResponseHeader", "PullMessageRequestHeader", "PullMessageResponseHeader",
    "QueryConsumerOffsetRequestHeader", "QueryMessageRequestHeader", "QueryMessageResponseHeader",
    "SearchOffsetRequestHeader", "SendMessageRequestHeader", "SendMessageResponseHeader",
    "UnregisterClientRequestHeader", "UpdateConsumerOffsetRequestHeader",
    "ViewMessageRequestHeader", "reply", "send_header", "v2_ext",
]


class HeaderError(ValueError):
    """A request's extFields lack a required field or hold one of the wrong type."""


@dataclass(frozen=True, slots=True)
class Header:
    """Base: fields in Java declaration order; ``WIRE`` renames fields (default: camelCase)."""

    WIRE: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def wire_names(cls) -> list[tuple[str, str]]:
        return [(f.name, cls.WIRE.get(f.name, _camel(f.name))) for f in dataclasses.fields(cls)]

    @classmethod
    def from_ext(cls, ext: Mapping[str, str] | None) -> Self:
        ext = ext or {}
        values: dict[str, Any] = {}
        for name, wire, kind, required in _spec(cls):
            text = ext.get(wire)
            if text is None:
                if required:
                    raise HeaderError(f"the request lacks the field {wire!r} ({cls.__name__})")
                continue
            values[name] = _parse(text, kind, wire)
        return cls(**values)

    @classmethod
    def of(cls, frame: RemotingFrame) -> Self:
        """The header of a request frame (``from_ext`` of its extFields)."""
        return cls.from_ext(frame.ext)

    def to_ext(self) -> tuple[dict[str, str], tuple[str, ...]]:
        """The extFields and the order Java would put them in (nulls left out)."""
        ext: dict[str, str] = {}
        for name, wire, _kind, _required in _spec(type(self)):
            value = getattr(self, name)
            if value is not None:
                ext[wire] = _text(value)
        return ext, tuple(ext)


_SPECS: dict[type, list[tuple[str, str, Any, bool]]] = {}


def _spec(cls: type[Header]) -> list[tuple[str, str, Any, bool]]:
    """(field, wire name, base type, required) per field of ``cls``, worked out once."""
    spec = _SPECS.get(cls)
    if spec is None:
        hints = get_type_hints(cls)
        spec = []
        for f in dataclasses.fields(cls):
            kind = hints[f.name]
            if getattr(kind, "__args__", None) and type(None) in kind.__args__:
                kind = next(a for a in kind.__args__ if a is not type(None))
            required = f.default is dataclasses.MISSING
            spec.append((f.name, cls.WIRE.get(f.name, _camel(f.name)), kind, required))
        _SPECS[cls] = spec
    return spec


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _parse(text: str, base: Any, wire: str) -> Any:
    if base is bool:
        return text.strip().lower() == "true"
    if base is int:
        try:
            return int(text.strip())
        except ValueError:
            raise HeaderError(f"the field {wire!r} must be an integer, got {text!r:.40}") from None
    return text


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True, slots=True)
class SendMessageRequestHeader(Header):
    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: int
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: str | None = None
    reconsume_times: int | None = None
    unit_mode: bool = False
    batch: bool = False
    max_reconsume_times: int | None = None


_V2_LETTERS = {"a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums",
               "e": "queueId", "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties",
               "j": "reconsumeTimes", "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch"}


def reply(request: RemotingFrame, code: int, header: Header | None = None, body: bytes = b"",
          remark: str | None = None) -> RemotingFrame:
    """``request``'s answer carrying ``header`` as its extFields (in Java's order) and ``body``."""
    if header is None:
        return request.response(code, None, body, remark)
    ext, order = header.to_ext()
    return request.response(code, ext, body, remark, order)


def v2_ext(header: SendMessageRequestHeader) -> tuple[dict[str, str], tuple[str, ...]]:
    """``header`` under SendMessageRequestHeaderV2's one-letter names (SEND_MESSAGE_V2 and
    SEND_BATCH_MESSAGE as the Java client sends them)."""
    letters = {name: letter for letter, name in _V2_LETTERS.items()}
    ext, order = header.to_ext()
    return {letters[k]: v for k, v in ext.items()}, tuple(letters[k] for k in order)


def send_header(request: RemotingFrame, code: int | None = None) -> SendMessageRequestHeader:
    """The send header of a SEND_MESSAGE, SEND_MESSAGE_V2 or SEND_BATCH_MESSAGE (V2 names);
    ``code``: read as this request's (default: the frame's)."""
    code = request.code if code is None else code
    ext = request.ext
    if code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE) and ext and "b" in ext:
        ext = {_V2_LETTERS[k]: v for k, v in ext.items() if k in _V2_LETTERS}
    return SendMessageRequestHeader.from_ext(ext)


@dataclass(frozen=True, slots=True)
class SendMessageResponseHeader(Header):
    """``msg_region``, ``trace_on``: what a broker puts in extFields beside the header's fields
    (``MSG_REGION``, ``TRACE_ON``), read into the client's ``SendResult``."""

    WIRE: ClassVar[Mapping[str, str]] = {"msg_region": "MSG_REGION", "trace_on": "TRACE_ON"}

    msg_id: str
    queue_id: int
    queue_offset: int
    transaction_id: str | None = None
    trace_on: bool | None = None
    msg_region: str | None = None


@dataclass(frozen=True, slots=True)
class PullMessageRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int
    sys_flag: int
    commit_offset: int
    suspend_timeout_millis: int
    sub_version: int
    subscription: str | None = None
    expression_type: str | None = None


@dataclass(frozen=True, slots=True)
class PullMessageResponseHeader(Header):
    suggest_which_broker_id: int
    next_begin_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class QueryConsumerOffsetRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: int


@dataclass(frozen=True, slots=True)
class UpdateConsumerOffsetRequestHeader(Header):
    consumer_group: str
    topic: str
    queue_id: int
    commit_offset: int


@dataclass(frozen=True, slots=True)
class OffsetResponseHeader(Header):
    """``QueryConsumerOffset``/``GetMaxOffset``/``GetMinOffset``/``SearchOffset`` answers."""

    offset: int


@dataclass(frozen=True, slots=True)
class GetMaxOffsetRequestHeader(Header):
    """Also GET_MIN_OFFSET's (``GetMinOffsetRequestHeader``: the same fields)."""

    topic: str
    queue_id: int


@dataclass(frozen=True, slots=True)
class SearchOffsetRequestHeader(Header):
    topic: str
    queue_id: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class ViewMessageRequestHeader(Header):
    offset: int


@dataclass(frozen=True, slots=True)
class QueryMessageRequestHeader(Header):
    """``unique_key_query``: the client's ext ``_UNIQUE_KEY_QUERY`` (the key is a UNIQ_KEY)."""

    WIRE: ClassVar[Mapping[str, str]] = {"unique_key_query": "_UNIQUE_KEY_QUERY"}

    topic: str
    key: str
    max_num: int
    begin_timestamp: int
    end_timestamp: int
    unique_key_query: bool = False


@dataclass(frozen=True, slots=True)
class QueryMessageResponseHeader(Header):
    index_last_update_timestamp: int
    index_last_update_phyoffset: int


@dataclass(frozen=True, slots=True)
class CreateTopicRequestHeader(Header):
    topic: str
    default_topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_filter_type: str
    topic_sys_flag: int | None = None
    order: bool = False


@dataclass(frozen=True, slots=True)
class CheckTransactionStateRequestHeader(Header):
    """The broker's question to a transactional producer (broker -> client, oneway)."""

    tran_state_table_offset: int
    commit_log_offset: int
    msg_id: str | None = None
    transaction_id: str | None = None
    offset_msg_id: str | None = None


@dataclass(frozen=True, slots=True)
class NotifyConsumerIdsChangedRequestHeader(Header):
    consumer_group: str


@dataclass(frozen=True, slots=True)
class GetTopicStatsInfoRequestHeader(Header):
    topic: str


@dataclass(frozen=True, slots=True)
class GetConsumeStatsRequestHeader(Header):
    consumer_group: str
    topic: str | None = None


@dataclass(frozen=True, slots=True)
class ConsumerSendMsgBackRequestHeader(Header):
    offset: int
    group: str
    delay_level: int
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    unit_mode: bool = False
    max_reconsume_times: int | None = None


@dataclass(frozen=True, slots=True)
class GetConsumerListByGroupRequestHeader(Header):
    consumer_group: str


@dataclass(frozen=True, slots=True)
class UnregisterClientRequestHeader(Header):
    WIRE: ClassVar[Mapping[str, str]] = {"client_id": "clientID"}

    client_id: str
    producer_group: str | None = None
    consumer_group: str | None = None


@dataclass(frozen=True, slots=True)
class GetRouteInfoRequestHeader(Header):
    topic: str
    accept_standard_json_only: bool | None = None


@dataclass(frozen=True, slots=True)
class EndTransactionRequestHeader(Header):
    producer_group: str
    tran_state_table_offset: int
    commit_log_offset: int
    commit_or_rollback: int
    msg_id: str
    from_transaction_check: bool = False
    transaction_id: str | None = None
