"""The ``raftmq`` data source's options, parsed and checked once, on the driver.

Pure Python (no pyspark, no pyarrow): the parsed :class:`SourceOptions` is a frozen,
picklable value that travels to the Python workers inside each partition.

Offsets specs (``startingOffsets`` / ``endingOffsets``):

* ``earliest`` / ``latest``;
* a store timestamp: integer milliseconds since the epoch, or ISO 8601
  (``2026-05-01T12:00:00Z``; without a zone it is UTC) -- the first message stored at or
  after it, per queue;
* JSON per queue, keyed by broker group then queue id: ``{"g1": {"0": 120, "3": -2}}``
  (``-2`` earliest, ``-1`` latest); with ``topics`` / ``topicPattern`` keyed by topic
  first: ``{"orders": {"g1": {"0": 120}}}``. A queue the JSON leaves out starts at
  ``earliest`` (``startingOffsets``) or ends at ``latest`` (``endingOffsets``).

Topics: exactly one of ``topic`` (one topic), ``topics`` (a comma list) and
``topicPattern`` (a Python regular expression matched in full against the topics the
cluster holds, resolved again at each planning, so that a topic created while a stream
runs joins it).

Credentials, for groups with ACLs on (docs/SECURITY.md): ``user`` and ``password``, or
``credentialsFile`` (two lines, read on the driver). The reads need ``sub`` on the topics;
``topicPattern`` also ``list`` on the cluster (GET_TOPICS).
The password travels to the workers inside the options, as any Spark source's secrets do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from client.credentials import Credentials
from client.tag_filter import SubscriptionError, TagSelector, parse_tags
from protocol.names import InvalidName, validate_group, validate_topic
from protocol.pull import MAX_PULL  # the broker's largest page
from protocol.sql_filter import FilterSyntaxError, compile_filter
from protocol.tls import ClientTls

__all__ = ["EARLIEST", "LATEST", "OffsetSpec", "OptionError", "SourceOptions", "parse_offset_spec",
           "parse_options", "parse_timestamps_spec"]

READ_FROM = ("follower", "leader", "any")
EARLIEST = -2
LATEST = -1


class OptionError(ValueError):
    """An option of the ``raftmq`` source that cannot be used; the message says how to fix it."""


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where reading starts or ends: ``kind`` earliest / latest / timestamp / per-queue."""

    kind: Literal["earliest", "latest", "timestamp", "queues", "timestamps"]
    timestamp_ms: int | None = None
    #: kind "queues": (group, queue id) -> offset, or EARLIEST / LATEST; kind "timestamps":
    #: (group, queue id) -> store timestamp ms (``startingOffsetsByTimestamp``)
    #: (topic, group, queue id) -> ...; with the option ``topic`` the topic is that one
    queues: tuple[tuple[tuple[str, str, int], int], ...] = ()

    def for_queue(self, topic: str, group: str, queue_id: int) -> int | None:
        """The explicit offset of one queue (EARLIEST/LATEST allowed), None if not given."""
        for key, offset in self.queues:
            if key == (topic, group, queue_id):
                return offset
        return None


@dataclass(frozen=True, slots=True)
class SourceOptions:
    topic: str = ""                 # the option ``topic`` ("" with ``topics`` / ``topicPattern``)
    topics: tuple[str, ...] = ()    # the option ``topics``
    topic_pattern: str | None = None  # the option ``topicPattern`` (matched in full)
    namesrv: tuple[str, ...] = ()
    servers: tuple[str, ...] = ()
    read_from: str = "follower"
    starting: OffsetSpec | None = None      # None: the mode's default (batch earliest, stream latest)
    ending: OffsetSpec = OffsetSpec("latest")
    max_records_per_trigger: int | None = None
    min_records_per_trigger: int | None = None  # a batch waits for this many new offsets ...
    max_trigger_delay_s: float = 900.0          # ... at most this long after the last batch
    max_records_per_partition: int = 100_000
    tags: str | None = None
    sql_filter: str | None = None  # SQL92 over the properties, evaluated by the brokers
    group_id: str | None = None    # streaming: progress committed to this consumer group
    fail_on_data_loss: bool = True  # False: what retention removed is skipped with a WARNING
    pull_batch: int = MAX_PULL
    pipeline: int = 2
    arrow_batch_rows: int = 8192
    follower_wait_s: float = 30.0
    request_timeout_s: float = 10.0
    tls: ClientTls | None = None  # None: plain (decided on the driver, environment included)
    user: str | None = None
    password: str | None = None

    def __repr__(self) -> str:  # never print the password
        return f"SourceOptions({self.describe_topics()}, user={self.user!r}, ...)"

    @property
    def single_topic(self) -> str | None:
        """The option ``topic``'s topic: offsets (checkpoint, JSON specs) are then keyed by
        group and queue id only; None with ``topics`` / ``topicPattern`` (keyed by topic first)."""
        return self.topic or None

    def describe_topics(self) -> str:
        if self.topic_pattern is not None:
            return f"topicPattern={self.topic_pattern!r}"
        return f"topics={','.join(self.topics)!r}" if self.topics else f"topic={self.topic!r}"

    def matches(self, topic: str) -> bool:
        """Whether the source reads ``topic`` (``topicPattern``: matched in full)."""
        if self.topic_pattern is not None:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return topic in self.topics if self.topics else topic == self.topic

    def credentials(self) -> Credentials | None:
        return None if self.user is None else Credentials(self.user, self.password or "")

    def selector(self) -> TagSelector:
        return parse_tags(self.tags)

    def client_args(self) -> dict[str, Any]:
        """``namesrv=`` or ``servers=``, ``tls=`` and ``credentials=``, for a ClientCore."""
        where: dict[str, Any] = ({"namesrv": list(self.namesrv)} if self.namesrv
                                 else {"servers": list(self.servers)})
        return {**where, "tls": self.tls or False, "credentials": self.credentials()}


def _addresses(value: str | None) -> tuple[str, ...]:
    return tuple(a.strip() for a in (value or "").split(",") if a.strip())


def _positive_int(opts: Mapping[str, str], key: str, name: str, default: int | None,
                  maximum: int | None = None) -> int | None:
    raw = opts.get(key)
    if raw is None or str(raw).strip() == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option {name} must be a positive integer, got {raw!r}") from None
    if value <= 0 or (maximum is not None and value > maximum):
        bound = f" and at most {maximum}" if maximum is not None else ""
        raise OptionError(f"option {name} must be > 0{bound}, got {value}")
    return value


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _duration_s(opts: Mapping[str, str], key: str, name: str, default: float) -> float:
    """A duration: milliseconds, or a number with ms / s / m / h (``"15m"``)."""
    raw = str(opts.get(key, "")).strip().lower()
    if not raw:
        return default
    for unit in ("ms", "s", "m", "h"):
        if raw.endswith(unit) and raw[:-len(unit)].strip().replace(".", "", 1).isdigit():
            return float(raw[:-len(unit)]) * _UNITS[unit]
    if raw.isdigit():
        return int(raw) / 1000
    raise OptionError(f"option {name} must be milliseconds or a duration like '30s' or '15m', got {raw!r}")


def parse_offset_spec(value: str, name: str, topic: str | None) -> OffsetSpec:
    """Parse one ``startingOffsets`` / ``endingOffsets`` value (module docstring); ``topic``:
    the option ``topic`` (JSON keyed by group), None for several topics (keyed by topic first)."""
    text = value.strip()
    low = text.lower()
    if low in ("earliest", "latest"):
        return OffsetSpec(low)  # type: ignore[arg-type]
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise OptionError(f"option {name}: not valid JSON ({e}): {text!r}") from None
        return OffsetSpec("queues", queues=_queue_offsets(doc, name, topic))
    if text.lstrip("-").isdigit():
        ms = int(text)
        if ms < 0:
            raise OptionError(f"option {name}: a timestamp must be >= 0 ms, got {ms}")
        return OffsetSpec("timestamp", timestamp_ms=ms)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise OptionError(
            f"option {name} must be 'earliest', 'latest', a timestamp (ms since the epoch or ISO 8601) "
            f'or JSON per queue like {{"g1": {{"0": 42}}}}, got {value!r}') from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return OffsetSpec("timestamp", timestamp_ms=int(when.timestamp() * 1000))


def parse_timestamps_spec(value: str, name: str, topic: str | None) -> OffsetSpec:
    """``startingOffsetsByTimestamp`` / ``endingOffsetsByTimestamp``: JSON per queue of store
    timestamps in ms, ``{"g1": {"0": 1764300000000}}`` (``topic`` as for ``parse_offset_spec``)."""
    try:
        doc = json.loads(value)
    except ValueError as e:
        raise OptionError(f"option {name}: not valid JSON ({e}): {value!r}") from None
    queues = _queue_offsets(doc, name, topic)
    for (_, group, qid), ms in queues:
        if ms < 0:
            raise OptionError(f"option {name}: queue {group}#{qid} has timestamp {ms} "
                              "(ms since the epoch, >= 0)")
    return OffsetSpec("timestamps", queues=queues)


def _queue_offsets(doc: object, name: str, topic: str | None) -> tuple[tuple[tuple[str, str, int], int], ...]:
    if topic is not None:
        return tuple(sorted(((topic, g, q), o) for (g, q), o in _group_offsets(doc, name, "")))
    shape = (f'option {name}: with topics or topicPattern, JSON offsets are '
             f'{{"<topic>": {{"<broker group>": {{"<queue id>": offset}}}}}}')
    if not isinstance(doc, dict):
        raise OptionError(f"{shape}, got {doc!r}")
    out: list[tuple[tuple[str, str, int], int]] = []
    for t, groups in doc.items():
        if not isinstance(groups, dict) or not all(isinstance(v, dict) for v in groups.values()):
            raise OptionError(f"{shape}; topic {t!r} maps to {groups!r}")
        out += [((str(t), g, q), o) for (g, q), o in _group_offsets(groups, name, f" of topic {t!r}")]
    return tuple(sorted(out))


def _group_offsets(doc: object, name: str, where: str) -> list[tuple[tuple[str, int], int]]:
    shape = f'option {name}: JSON offsets are {{"<broker group>": {{"<queue id>": offset}}}}'
    if not isinstance(doc, dict):
        raise OptionError(f"{shape}, got {doc!r}")
    out: list[tuple[tuple[str, int], int]] = []
    for group, queues in doc.items():
        if not isinstance(queues, dict):
            raise OptionError(f"{shape}; group {group!r}{where} maps to {queues!r}")
        for qid, offset in queues.items():
            try:
                q = int(qid)
            except (TypeError, ValueError):
                raise OptionError(f"{shape}; {qid!r} of group {group!r}{where} is not a queue id") from None
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST or q < 0:
                raise OptionError(f"{shape}; queue {group}#{qid}{where} has offset {offset!r} "
                                  "(an offset >= 0, -2 for earliest or -1 for latest)")
            out.append(((str(group), q), offset))
    return out


def _topics(opts: Mapping[str, str]) -> tuple[str, tuple[str, ...], str | None]:
    """(topic, topics, topicPattern): exactly one of the three options."""
    topic = (opts.get("topic") or "").strip()
    names = tuple(dict.fromkeys(t.strip() for t in str(opts.get("topics") or "").split(",") if t.strip()))
    pattern = opts.get("topicpattern")
    given = [n for n, v in (("topic", topic), ("topics", names), ("topicPattern", pattern))
             if v is not None and str(v).strip() != "" and v != ()]
    if len(given) != 1:
        what = f" (got {', '.join(given)})" if given else ""
        raise OptionError("give exactly one of the options topic ('orders'), topics ('orders,returns') "
                          f"or topicPattern (a regular expression matched in full, 'orders-.*'){what}")
    if names:
        for t in names:
            try:
                validate_topic(t)
            except InvalidName as e:
                raise OptionError(f"option topics: {e}") from None
        return "", names, None
    if pattern is not None and str(pattern).strip():
        try:
            re.compile(str(pattern))
        except re.error as e:
            raise OptionError(f"option topicPattern: {str(pattern)!r} is not a regular expression "
                              f"({e})") from None
        return "", (), str(pattern)
    return topic, (), None


def _check_spec_topics(opts: SourceOptions, spec: OffsetSpec | None, name: str) -> None:
    """A JSON spec of several topics names only topics the source reads."""
    for (t, _, _), _ in spec.queues if spec is not None else ():
        if not opts.matches(t):
            raise OptionError(f"option {name} names topic {t!r}, which the source does not read "
                              f"({opts.describe_topics()})")


def _credentials(opts: Mapping[str, str]) -> tuple[str | None, str | None]:
    path = opts.get("credentialsfile")
    if path:
        try:
            found = Credentials.from_file(path)
        except (OSError, ValueError) as e:
            raise OptionError(f"option credentialsFile: {e}") from None
        return found.user, found.password
    user, password = opts.get("user"), opts.get("password")
    if (user is None) != (password is None):
        raise OptionError("give the options user and password together (or credentialsFile)")
    return user, password


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Check the options given to ``spark.read.format("raftmq")``; keys are case-insensitive."""
    opts = {str(k).lower(): v for k, v in options.items() if v is not None}
    topic, topics, topic_pattern = _topics(opts)
    one = topic or None  # JSON offsets keyed by group (topic) or by topic first (topics, topicPattern)
    namesrv, servers = _addresses(opts.get("namesrv")), _addresses(opts.get("servers"))
    if bool(namesrv) == bool(servers):
        raise OptionError("give exactly one of the options namesrv ('host:port[,host:port]', the name "
                          "servers) or servers ('host:port,host:port,...', the nodes of one broker group)")
    read_from = (opts.get("readfrom") or "follower").strip().lower()
    if read_from not in READ_FROM:
        raise OptionError(f"option readFrom must be one of {', '.join(READ_FROM)}, got {read_from!r}")
    starting = opts.get("startingoffsets")
    ending = opts.get("endingoffsets")
    by_time = {k: opts.get(f"{k.lower()}bytimestamp") for k in ("startingOffsets", "endingOffsets")}
    tags = opts.get("tags")
    if tags is not None:
        try:
            parse_tags(tags)
        except SubscriptionError as e:
            raise OptionError(f"option tags: {e}") from None
    sql_filter = (opts.get("filter") or "").strip() or None
    if sql_filter is not None:
        try:
            compile_filter(sql_filter)
        except FilterSyntaxError as e:
            raise OptionError(f"option filter: {e}") from None
    lose = str(opts.get("failondataloss", "true")).strip().lower()
    if lose not in ("true", "false"):
        raise OptionError(f"option failOnDataLoss must be true or false, got {opts['failondataloss']!r}")
    group_id = (opts.get("groupid") or "").strip() or None
    if group_id is not None:
        try:
            validate_group(group_id)
        except InvalidName as e:
            raise OptionError(f"option groupId: {e}") from None
    tls = _tls(opts)
    wait_ms = _positive_int(opts, "followerwaitms", "followerWaitMs", 30_000)
    timeout_ms = _positive_int(opts, "requesttimeoutms", "requestTimeoutMs", 10_000)
    assert wait_ms is not None and timeout_ms is not None
    user, password = _credentials(opts)
    starting_spec = (parse_timestamps_spec(by_time["startingOffsets"], "startingOffsetsByTimestamp", one)
                     if by_time["startingOffsets"] else
                     parse_offset_spec(starting, "startingOffsets", one) if starting else None)
    ending_spec = (parse_timestamps_spec(by_time["endingOffsets"], "endingOffsetsByTimestamp", one)
                   if by_time["endingOffsets"] else
                   parse_offset_spec(ending, "endingOffsets", one) if ending else OffsetSpec("latest"))
    opts_out = SourceOptions(
        user=user, password=password,
        topic=topic, topics=topics, topic_pattern=topic_pattern,
        namesrv=namesrv, servers=servers, read_from=read_from,
        starting=starting_spec, ending=ending_spec,
        max_records_per_trigger=_positive_int(opts, "maxrecordspertrigger", "maxRecordsPerTrigger", None),
        min_records_per_trigger=_positive_int(opts, "minoffsetspertrigger", "minOffsetsPerTrigger", None),
        max_trigger_delay_s=_duration_s(opts, "maxtriggerdelay", "maxTriggerDelay", 900.0),
        max_records_per_partition=_positive_int(opts, "maxrecordsperpartition", "maxRecordsPerPartition",
                                                100_000) or 100_000,
        tags=tags if tags is not None and parse_tags(tags).tags is not None else None, sql_filter=sql_filter,
        group_id=group_id, fail_on_data_loss=lose == "true",
        pull_batch=_positive_int(opts, "pullbatch", "pullBatch", MAX_PULL, MAX_PULL) or MAX_PULL,
        pipeline=_positive_int(opts, "pipeline", "pipeline", 2, 8) or 2,
        arrow_batch_rows=_positive_int(opts, "arrowbatchrows", "arrowBatchRows", 8192) or 8192,
        follower_wait_s=wait_ms / 1000, request_timeout_s=timeout_ms / 1000, tls=tls)
    for spec, key in ((starting_spec, "startingOffsets"), (ending_spec, "endingOffsets")):
        _check_spec_topics(opts_out, spec, f"{key}ByTimestamp" if by_time[key] else key)
    return opts_out


def _tls(opts: Mapping[str, str]) -> ClientTls | None:
    """``tls`` ("true": the system's CAs), ``caFile``, ``certFile``, ``keyFile`` (paths every
    executor can read); none of them: the driver's ``$RAFTMQ_CA_FILE`` & co."""
    ca, cert, key = (str(opts[k]).strip() or None if k in opts else None
                     for k in ("cafile", "certfile", "keyfile"))
    flag = str(opts.get("tls", "")).strip().lower()
    if flag not in ("", "true", "false"):
        raise OptionError(f"option tls must be true or false, got {opts['tls']!r}")
    if flag == "false":
        if ca or cert:
            raise OptionError("option tls is false but caFile/certFile are given")
        return None
    if key and not cert:
        raise OptionError("option keyFile needs certFile (the client certificate of mutual TLS)")
    if ca or cert or flag == "true":
        return ClientTls(ca, cert, key)
    return ClientTls.from_env()
