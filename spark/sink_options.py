"""The options of the ``raftmq`` sink (``df.write.format("raftmq")``), parsed and checked
once, on the driver, into a frozen, picklable :class:`SinkOptions` that travels to the
Python workers inside the writer.

The cluster, TLS and credential options are the source's (``spark.options``): ``namesrv``
or ``servers``, ``tls`` / ``caFile`` / ``certFile`` / ``keyFile``, ``user`` + ``password``
or ``credentialsFile`` (the writes need ``pub`` on the topics). Pure Python: no pyspark.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from client.credentials import Credentials
from protocol.names import InvalidName, validate_topic
from protocol.tls import ClientTls
from spark.options import OptionError, _addresses, _credentials, _positive_int, _tls

__all__ = ["SinkOptions", "parse_sink_options"]


@dataclass(frozen=True, slots=True)
class SinkOptions:
    topic: str | None = None          # None: every row names its topic (column ``topic``)
    namesrv: tuple[str, ...] = ()
    servers: tuple[str, ...] = ()
    #: messages of one queue per SEND_BATCH request (at most ~1 MiB; records of <= 48 KiB in it)
    request_messages: int = 2048
    #: requests in flight per partition (one per queue at a time: sequence order)
    in_flight: int = 8
    write_timeout_s: float = 60.0
    request_timeout_s: float = 10.0
    tls: ClientTls | None = None
    user: str | None = None
    password: str | None = None

    def __repr__(self) -> str:  # never print the password
        return f"SinkOptions(topic={self.topic!r}, user={self.user!r}, ...)"

    def client_args(self) -> dict[str, Any]:
        """``namesrv=`` or ``servers=``, ``tls=`` and ``credentials=``, for a ClientCore."""
        where: dict[str, Any] = ({"namesrv": list(self.namesrv)} if self.namesrv
                                 else {"servers": list(self.servers)})
        creds = None if self.user is None else Credentials(self.user, self.password or "")
        return {**where, "tls": self.tls or False, "credentials": creds}


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Check the options given to ``df.write.format("raftmq")``; keys are case-insensitive."""
    opts = {str(k).lower(): v for k, v in options.items() if v is not None}
    topic = (opts.get("topic") or "").strip() or None
    if topic is not None:
        try:
            validate_topic(topic)
        except InvalidName as e:
            raise OptionError(f"option topic: {e}") from None
    namesrv, servers = _addresses(opts.get("namesrv")), _addresses(opts.get("servers"))
    if bool(namesrv) == bool(servers):
        raise OptionError("give exactly one of the options namesrv ('host:port[,host:port]', the name "
                          "servers) or servers ('host:port,host:port,...', the nodes of one broker group)")
    user, password = _credentials(opts)
    messages = _positive_int(opts, "requestmessages", "requestMessages", 2048, 2048)
    in_flight = _positive_int(opts, "maxinflight", "maxInFlight", 8, 64)
    write_ms = _positive_int(opts, "writetimeoutms", "writeTimeoutMs", 60_000)
    timeout_ms = _positive_int(opts, "requesttimeoutms", "requestTimeoutMs", 10_000)
    assert messages and in_flight and write_ms and timeout_ms
    return SinkOptions(topic=topic, namesrv=namesrv, servers=servers, request_messages=messages,
                       in_flight=in_flight, write_timeout_s=write_ms / 1000,
                       request_timeout_s=timeout_ms / 1000, tls=_tls(opts), user=user, password=password)
