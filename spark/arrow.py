"""The ``raftmq`` source's schema, and decoded columns as Arrow record batches.

Needs pyarrow (the ``spark`` extra), not pyspark. Times are ``timestamp[us, tz=UTC]``
(Spark's TIMESTAMP); a store time the broker could not find (-1) becomes null.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from spark.pages import Columns

__all__ = ["ARROW_SCHEMA", "COLUMNS", "SCHEMA_DDL", "to_record_batch"]

#: (name, Spark SQL type) in the order of the rows
COLUMNS = (
    ("topic", "STRING"),
    ("broker_group", "STRING"),
    ("queue_id", "INT"),
    ("queue_offset", "BIGINT"),
    ("commit_log_offset", "BIGINT"),
    ("msg_id", "STRING"),
    ("store_timestamp", "TIMESTAMP"),
    ("born_timestamp", "TIMESTAMP"),
    ("keys", "ARRAY<STRING>"),
    ("tags", "STRING"),
    ("properties", "MAP<STRING, STRING>"),
    ("body", "BINARY"),
)
SCHEMA_DDL = ", ".join(f"{name} {kind}" for name, kind in COLUMNS)

_TS = pa.timestamp("us", tz="UTC")
ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("broker_group", pa.string()),
    ("queue_id", pa.int32()),
    ("queue_offset", pa.int64()),
    ("commit_log_offset", pa.int64()),
    ("msg_id", pa.string()),
    ("store_timestamp", _TS),
    ("born_timestamp", _TS),
    ("keys", pa.list_(pa.string())),
    ("tags", pa.string()),
    ("properties", pa.map_(pa.string(), pa.string())),
    ("body", pa.binary()),
])


def _times(ms: list[int]) -> pa.Array:
    arr = pa.array(ms, pa.int64())
    micros = pc.multiply(arr, 1000)
    if ms and min(ms) < 0:
        micros = pc.if_else(pc.less(arr, 0), pa.scalar(None, pa.int64()), micros)
    return micros.cast(_TS)


def to_record_batch(cols: Columns) -> pa.RecordBatch:
    n = len(cols)
    return pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(cols.topic, pa.string()), n),
        pa.repeat(pa.scalar(cols.group, pa.string()), n),
        pa.repeat(pa.scalar(cols.queue_id, pa.int32()), n),
        pa.array(cols.queue_offset, pa.int64()),
        pa.array(cols.commit_log_offset, pa.int64()),
        pa.array(cols.msg_id, pa.string()),
        _times(cols.store_ms),
        _times(cols.born_ms),
        pa.array(cols.keys, pa.list_(pa.string())),
        pa.array(cols.tags, pa.string()),
        pa.array(cols.properties, pa.map_(pa.string(), pa.string())),
        pa.array(cols.body, pa.binary()),
    ], schema=ARROW_SCHEMA)
