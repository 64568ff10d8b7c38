"""``ClientLimits``: what one client -- or all of them -- may hold of a broker on its client port.

Set in the ``[broker]`` section (``broker.config``; every key optional)::

    max_connections = 4096              # TCP connections to the client port (WebSocket and HTTP)
    max_connections_per_address = 256   # of those, from one source address
    fd_reserve = 256                    # descriptors kept for the log, the state files, the Raft
                                        # port and the peers: a new client connection is refused
                                        # while fewer than this are left under RLIMIT_NOFILE
    idle_timeout_s = 120                # a connection that sent nothing (not even a ping) and has
                                        # no request in progress for this long is closed
    frame_deadline_s = 30               # a frame's bytes must all arrive within this
    max_partial_frame_bytes = 268435456 # bytes of frames still arriving, all connections together:
                                        # beyond, reading pauses until frames complete or expire
    max_inflight_bytes = 67108864       # request frames one connection has being served at once:
                                        # beyond, the broker reads no more of its frames
    max_parked_pulls_per_connection = 1024   # long polls waiting on one connection
    max_parked_pulls = 16384                 # ... and on the broker (a user: a quarter of it)

What each bound does, and where: ``broker.remoting.connection_guard`` (connections, descriptors,
frames), ``broker.remoting.frame_reader`` (idle, in-flight), ``broker.processors.long_polls`` (parked pulls).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from broker.processors.long_polls import MAX_PARKED_PER_CONNECTION, MAX_PARKED_TOTAL

__all__ = ["ClientLimits"]


@dataclass(frozen=True, slots=True)
class ClientLimits:
    max_connections: int = 4096
    max_connections_per_address: int = 256
    fd_reserve: int = 256
    idle_timeout_s: float = 120.0
    frame_deadline_s: float = 30.0
    max_partial_frame_bytes: int = 256 << 20
    max_inflight_bytes: int = 64 << 20
    max_parked_pulls_per_connection: int = MAX_PARKED_PER_CONNECTION
    max_parked_pulls: int = MAX_PARKED_TOTAL

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"{f.name} must be a positive number, not {value!r}")
        if self.frame_deadline_s > self.idle_timeout_s:
            raise ValueError(f"frame_deadline_s ({self.frame_deadline_s}) is above idle_timeout_s "
                             f"({self.idle_timeout_s})")
