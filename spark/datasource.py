"""PySpark Python Data Source ``raftmq``: batch and Structured Streaming reads from followers,
and writes (the sink: ``spark.sink``).

    from spark.datasource import register
    register(session)   # once per SparkSession
    df = (session.read.format("raftmq").option("servers", "127.0.0.1:7001,...")
          .option("topic", "orders").load())
    q = (session.readStream.format("raftmq").option("namesrv", "127.0.0.1:9876")
         .option("topic", "orders").option("maxRecordsPerTrigger", 100000).load()
         .writeStream.format("parquet").option("checkpointLocation", ck).start(out))

Options: see ``spark.options`` and docs/SPARK.md. Needs pyspark >= 4.2 (the two-argument
``latestOffset`` with admission control) and pyarrow; import this module only where
Spark is installed -- ``import spark`` alone never imports pyspark.

Every method here runs in a Python process of Spark's (driver-side planner processes,
the streaming source runner, the executors' workers): nothing unpicklable is kept on
``self``; each ``read`` opens its own client and loop (``spark.range_reader.read_columns``).

Streaming offsets are ``{"<group>": {"<queue id>": next offset}}`` in the checkpoint with
the option ``topic`` (``{"<topic>": {...}}`` around that with ``topics`` / ``topicPattern``),
the source of truth; ``commit`` copies them to the consumer group ``groupId`` if given. A
queue added to the topic -- or, with ``topicPattern``, a topic created -- while a query runs
enters the offsets at its earliest offset and is read from the next micro-batch on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark.arrow import SCHEMA_DDL, to_record_batch
from spark.options import SourceOptions, parse_options
from spark.planning import (
    Offsets,
    QueueBounds,
    QueueRange,
    admit,
    current_offsets,
    initial_offsets,
    offsets_from_json,
    offsets_to_json,
    plan_batch,
    plan_ranges,
)
from spark.progress import commit_progress
from spark.range_reader import read_columns
from spark.sink import RaftMQBatchWriter, RaftMQStreamWriter, check_sink_schema
from spark.sink_options import parse_sink_options

__all__ = ["LOCAL_CONF", "SCHEMA", "RaftMQDataSource", "local_session", "register"]

#: Settings of ``local_session``: 2 cores' worth of shuffle partitions, no UI, UTC.
LOCAL_CONF = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
              "spark.sql.shuffle.partitions": "2", "spark.sql.session.timeZone": "UTC"}


def register(session: Any) -> None:
    """Make ``format("raftmq")`` available in ``session``."""
    session.dataSource.register(RaftMQDataSource)


def local_session(app_name: str, conf: dict[str, str] | None = None) -> Any:
    """A ``local[2]`` SparkSession with ``LOCAL_CONF`` (and ``conf``), quiet logs and
    ``format("raftmq")`` registered: for the examples, the benchmark and the tests."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName(app_name)
    for key, value in {**LOCAL_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session


class RangePartition(InputPartition):
    """One queue range (``spark.planning.QueueRange``), picklable."""

    def __init__(self, rng: QueueRange) -> None:
        super().__init__(rng)
        self.rng = rng


def _read(opts: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, RangePartition):  # Spark's stand-in when there is nothing to read
        return
    for cols in read_columns(opts, partition.rng, opts.arrow_batch_rows):
        yield to_record_batch(cols)


SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("broker_group", StringType()),
    StructField("queue_id", IntegerType()),
    StructField("queue_offset", LongType()),
    StructField("commit_log_offset", LongType()),
    StructField("msg_id", StringType()),
    StructField("store_timestamp", TimestampType()),
    StructField("born_timestamp", TimestampType()),
    StructField("keys", ArrayType(StringType())),
    StructField("tags", StringType()),
    StructField("properties", MapType(StringType(), StringType())),
    StructField("body", BinaryType()),
])


def _check_schema(schema: StructType) -> None:
    if schema != SCHEMA:
        raise ValueError(f"the raftmq source has a fixed schema ({SCHEMA_DDL}); select the columns "
                         "you need after load() instead of passing a schema")


class RaftMQDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "raftmq"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_schema(schema)
        return RaftMQBatchReader(parse_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_schema(schema)
        return RaftMQStreamReader(parse_options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        opts = parse_sink_options(self.options)
        check_sink_schema(schema, opts)
        return RaftMQBatchWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        opts = parse_sink_options(self.options)
        check_sink_schema(schema, opts)
        return RaftMQStreamWriter(opts)


class RaftMQBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        return [RangePartition(r) for r in plan_batch(self.opts)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, partition)


class RaftMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._target: Offsets | None = None         # Trigger.AvailableNow: never beyond
        self._bounds: list[QueueBounds] | None = None  # from the last latestOffset, for partitions
        self._clock = time.monotonic
        self._last_batch_at: float | None = None  # minOffsetsPerTrigger: when a batch last went
        self._latest: Offsets | None = None  # what the replicas held at the last planning

    def initialOffset(self) -> dict:
        return self._to_json(initial_offsets(self.opts))

    def _to_json(self, offsets: Offsets) -> dict[str, Any]:
        return offsets_to_json(offsets, self.opts.single_topic)

    def _from_json(self, doc: dict[str, Any]) -> Offsets:
        return offsets_from_json(doc, self.opts.single_topic)

    def _available(self) -> Offsets:
        self._bounds = current_offsets(self.opts)
        self._latest = {b.key: b.high for b in self._bounds}
        return dict(self._latest)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._available()

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_records_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = self._from_json(start)
        available = self._available()
        bounds = {b.key: b for b in self._bounds or []}
        end: Offsets = {}
        for key, high in available.items():
            if key not in begin:  # a queue (or topic) new to this query: enters at its earliest offset
                end[key] = bounds[key].low
                continue
            if self._target is not None:
                high = min(high, self._target.get(key, begin[key]))
            end[key] = max(begin[key], high)  # a lagging replica may report less than the checkpoint
        for key, offset in begin.items():  # a queue no longer in the route (a topic gone) keeps its offset
            end.setdefault(key, offset)
        if isinstance(limit, ReadMaxRows):
            end = admit(begin, end, limit.max_rows)
        if self._wait_for_more(begin, end):
            return self._to_json(begin)
        return self._to_json(end)

    def _wait_for_more(self, begin: Offsets, end: Offsets) -> bool:
        """minOffsetsPerTrigger: True while fewer new offsets than it are available and the last
        batch went less than maxTriggerDelay ago (never under Trigger.AvailableNow)."""
        now = self._clock()
        if self._last_batch_at is None:
            self._last_batch_at = now
        least = self.opts.min_records_per_trigger
        new = sum(end[k] - begin.get(k, end[k]) for k in end)
        if least is not None and self._target is None and new < least \
                and now - self._last_batch_at < self.opts.max_trigger_delay_s:
            return True
        if new > 0:
            self._last_batch_at = now
        return False

    def reportLatestOffset(self) -> dict | None:
        """What the replicas held at the last planning (the query progress's ``latestOffset``,
        as spark-sql-kafka reports it): each queue's lag is it minus ``endOffset``. PySpark's
        Python sources have no custom-metrics hook (``avgOffsetsBehindLatest``)."""
        return None if self._latest is None else self._to_json(self._latest)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, stop = self._from_json(start), self._from_json(end)
        if not any(stop[k] > begin.get(k, stop[k]) for k in stop):
            return []
        bounds = self._bounds
        needed = {k for k in stop if stop[k] > begin.get(k, stop[k])}
        if bounds is None or not needed <= {b.key for b in bounds}:
            bounds = current_offsets(self.opts)  # a restarted query replays its last batch first
        starts = {k: begin.get(k, stop[k]) for k in stop}
        ranges = plan_ranges(bounds, starts, stop, self.opts.max_records_per_partition)
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, partition)

    def commit(self, end: dict) -> None:
        if self.opts.group_id is not None:  # a copy for `raftmq group progress`, best effort
            commit_progress(self.opts, self._from_json(end))
