"""The errors of reading a ``raftmq`` source: planning (``spark.planning``) and reading a
queue range (``spark.range_reader``) raise them. Every one is a :class:`ReadError`; its
message names the queue, the range and the replica where there is one.
"""

from __future__ import annotations

__all__ = ["DataLossError", "RangeMismatchError", "ReadError", "ReplicaUnavailableError"]


class ReadError(RuntimeError):
    """Reading a queue range failed; the message names the queue, the range and the replica."""


class ReplicaUnavailableError(ReadError):
    """No replica allowed by ``readFrom`` answered in time."""


class RangeMismatchError(ReadError):
    """A replica returned something other than exactly the requested range."""


class DataLossError(ReadError):
    """Messages of the range are no longer retained (retention deleted them)."""
