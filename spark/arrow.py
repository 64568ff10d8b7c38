"""The ``raftmq`` source's schema, and decoded columns as Arrow record batches.

Needs pyarrow (the ``spark`` extra), not pyspark. Times are ``timestamp[us, tz=UTC]``
(Spark's TIMESTAMP); a store time the broker could not find (-1) becomes null.
"""

from __future__ import annotations

import binascii

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
_PROPERTIES = pa.map_(pa.string(), pa.string())
_NO_STRINGS = pa.array([], pa.string())


def _times(ms: pa.Array) -> pa.Array:
    micros = pc.multiply(ms, 1000)
    if len(ms) and pc.min(ms).as_py() < 0:
        micros = pc.if_else(pc.less(ms, 0), pa.scalar(None, pa.int64()), micros)
    return micros.cast(_TS)


def _hex_ids(ids: bytes | bytearray, n: int) -> pa.Array:
    """``n`` ids of 16 bytes as strings of 32 hex digits: one hex of the whole block and its
    offsets (0, 32, 64, ...), no string per id."""
    steps = pa.concat_arrays([pa.array([0], pa.int32()), pa.repeat(pa.scalar(32, pa.int32()), n)])
    offsets = pc.cumulative_sum(steps)
    text = pa.py_buffer(binascii.hexlify(ids))
    return pa.Array.from_buffers(pa.string(), n, [None, offsets.buffers()[1], text])


def _properties(props: list[dict[str, str]]) -> pa.Array:
    if any(props):
        return pa.array(props, _PROPERTIES)
    # none has properties (the common case): empty maps from their offsets alone
    return pa.MapArray.from_arrays(pa.array([0] * (len(props) + 1), pa.int32()), _NO_STRINGS, _NO_STRINGS)


def to_record_batch(cols: Columns) -> pa.RecordBatch:
    """``cols`` as one batch of ``ARROW_SCHEMA``: pyarrow converts each column in bulk (no
    Python loop per row: times added and scaled, ids hex-encoded, offsets ranged in Arrow)."""
    n = len(cols)
    if len(cols.msg_ids) != 16 * n:
        raise ValueError(f"{len(cols.msg_ids)} bytes of ids for {n} messages")
    born = pc.add(pa.array(cols.born_base_ms, pa.int64()), pa.array(cols.born_delta_ms, pa.int64()))
    return pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(cols.topic, pa.string()), n),
        pa.repeat(pa.scalar(cols.group, pa.string()), n),
        pa.repeat(pa.scalar(cols.queue_id, pa.int32()), n),
        pa.array(cols.queue_offset, pa.int64()),
        pa.array(cols.commit_log_offset, pa.int64()),
        _hex_ids(cols.msg_ids, n),
        _times(pa.array(cols.store_ms, pa.int64())),
        _times(born),
        pa.array(cols.keys, pa.list_(pa.string())),
        pa.array(cols.tags, pa.string()),
        _properties(cols.properties),
        pa.array(cols.body, pa.binary()),
    ], schema=ARROW_SCHEMA)
