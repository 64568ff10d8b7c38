"""The ``raftmq`` sink of the PySpark data source: ``df.write.format("raftmq")`` and
``df.writeStream.format("raftmq")`` (``spark.datasource.RaftMQDataSource.writer`` /
``streamWriter``), Arrow in, ``spark.sink_writer`` on each Python worker.

Producer identity (the brokers deduplicate per producer id, topic and queue):

* a streaming write: ``spark/<query id>/<batch id>/<partition>`` -- the query id is kept in
  the checkpoint, so a micro-batch replayed after a driver restart, a task re-attempt and
  a speculative copy all write as the same producer, and the brokers store its records
  once (docs/SPARK.md says when that holds);
* a batch write: ``spark/<random id of this write>/<partition>`` -- task re-attempts of
  one ``save()`` are deduplicated, a second ``save()`` writes again.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from spark.options import OptionError
from spark.sink_options import SinkOptions
from spark.sink_writer import WriteSummary, write_partition

__all__ = ["RaftMQBatchWriter", "RaftMQStreamWriter", "WriteCommit", "check_sink_schema"]

log = logging.getLogger("spark.sink")

_TYPES: dict[str, tuple[type[DataType], ...]] = {
    "topic": (StringType,), "body": (BinaryType, StringType), "tags": (StringType,),
    "shard_key": (StringType,), "deliver_at_ms": (LongType, IntegerType),
    "delay_level": (IntegerType, ShortType, LongType)}


def check_sink_schema(schema: StructType, opts: SinkOptions) -> None:
    """OptionError naming the column when the DataFrame cannot be written."""
    fields = {f.name: f.dataType for f in schema.fields}
    if "body" not in fields:
        raise OptionError("the raftmq sink needs a column body (binary or string)")
    if "topic" not in fields and opts.topic is None:
        raise OptionError("the raftmq sink needs a column topic or the option topic")
    for name, kinds in _TYPES.items():
        if name in fields and not isinstance(fields[name], kinds):
            raise OptionError(f"column {name} is {fields[name].simpleString()}, the sink takes "
                              f"{' or '.join(k.typeName() for k in kinds)}")
    keys = fields.get("keys")
    if keys is not None and not (isinstance(keys, ArrayType) and isinstance(keys.elementType, StringType)):
        raise OptionError(f"column keys is {keys.simpleString()}, the sink takes array<string>")
    props = fields.get("properties")
    if props is not None and not (isinstance(props, MapType) and isinstance(props.keyType, StringType)
                                  and isinstance(props.valueType, StringType)):
        raise OptionError(f"column properties is {props.simpleString()}, the sink takes map<string,string>")


@dataclass
class WriteCommit(WriterCommitMessage):
    """One task's summary, back to the driver."""

    producer_id: str
    summary: WriteSummary


def _task() -> tuple[int, TaskContext | None]:
    context = TaskContext.get()
    return (context.partitionId() if context is not None else 0), context


def _log_commit(what: str, messages: list[WriteCommit | None]) -> None:
    done = [m for m in messages if m is not None]
    rows = sum(m.summary.rows for m in done)
    dupes = sum(m.summary.duplicates for m in done)
    log.info("%s: %d rows in %d partitions, %d already stored", what, rows, len(done), dupes)


class RaftMQBatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts
        self.write_id = uuid.uuid4().hex  # made on the driver: every task and re-attempt shares it

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommit:
        partition, _ = _task()
        producer_id = f"spark/{self.write_id}/{partition}"
        return WriteCommit(producer_id, write_partition(self.opts, producer_id, iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        _log_commit(f"batch write {self.write_id}", messages)  # type: ignore[arg-type]


class RaftMQStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommit:
        partition, context = _task()
        query = context.getLocalProperty("sql.streaming.queryId") if context else None
        batch = context.getLocalProperty("streaming.sql.batchId") if context else None
        if not query or batch is None:
            raise RuntimeError("the raftmq stream writer found no query id / batch id in the task's "
                               "local properties (sql.streaming.queryId, streaming.sql.batchId)")
        producer_id = f"spark/{query}/{batch}/{partition}"
        return WriteCommit(producer_id, write_partition(self.opts, producer_id, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        _log_commit(f"micro-batch {batchId}", messages)  # type: ignore[arg-type]

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        log.warning("micro-batch %d aborted: its retry writes as the same producers", batchId)
