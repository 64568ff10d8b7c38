"""The deploy's ports tried as a stranger on the client host would, run there by the test:

    python port_probes.py '{"brokers": [ADDR, ...], "raft": [ADDR, ...], "ungranted": FILE | null}'

* each broker's client port (wss://, the CA of ``RAFTMQ_CA_FILE``): a SEND_MESSAGE to topic
  ``orders`` on a connection that never authenticated, and one on a connection that
  authenticated as the user of credentials file FILE (a user without ``pub`` there) --
  each answer's code and remark, or the login's refusal;
* each Raft port, on a plain TCP connection: the first frame a pysyncobj without the
  cluster secret sends (``zlib(pickle("readonly"))`` behind its int32 length), and a
  connection that sends nothing -- how many bytes came back and how it ended (``eof``,
  ``reset``, or ``open`` when it was still open after ``RAFT_DEADLINE_S``).

Prints one JSON line: {"brokers": {ADDR: {"anonymous": ..., "ungranted": ...}},
"raft": {ADDR: {"frame": ..., "silent": ...}}}.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import socket
import struct
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from client.aio.connection import ConnectionPool
from client.credentials import Credentials
from client.errors import BrokerError
from protocol.message_format import Message, encode_message
from protocol.remoting import ResponseCode
from protocol.send import SendMessageRequest
from protocol.tls import ClientTls

#: dledger/raft/peer_guard.py closes an unproven connection after 5 s; room for a busy host
RAFT_DEADLINE_S = 15.0


async def _send(address: str, credentials: Credentials | None, tls: ClientTls | None) -> dict[str, Any]:
    pool = ConnectionPool(tls=tls, credentials=credentials)
    request = SendMessageRequest(message=encode_message(Message(topic="orders", body=b"probe")))
    try:
        reply = await pool.call(address, request, timeout=15)
        return {"code": ResponseCode(reply.code).name, "remark": reply.remark}
    except BrokerError as e:  # the login refused
        return {"login_refused": ResponseCode(e.code).name, "remark": str(e)}
    finally:
        await pool.close()


async def _brokers(addresses: list[str], ungranted: str | None,
                   tls: ClientTls | None) -> dict[str, dict[str, Any]]:
    creds = Credentials(*Path(ungranted).read_text().splitlines()[:2]) if ungranted else None
    out: dict[str, dict[str, Any]] = {}
    for address in addresses:
        out[address] = {"anonymous": await _send(address, None, tls)}
        if creds is not None:
            out[address]["ungranted"] = await _send(address, creds, tls)
    return out


def _raft(address: str, first: bytes) -> dict[str, Any]:
    host, port = address.rsplit(":", 1)
    t0 = time.monotonic()
    received = b""
    ended = "open"
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        if first:
            sock.sendall(first)
        while time.monotonic() - t0 < RAFT_DEADLINE_S:
            sock.settimeout(max(0.1, RAFT_DEADLINE_S - (time.monotonic() - t0)))
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                break
            except ConnectionResetError:
                ended = "reset"
                break
            if not chunk:
                ended = "eof"
                break
            received += chunk
    return {"received": len(received), "ended": ended, "after_s": round(time.monotonic() - t0, 2)}


def main() -> None:
    args = json.loads(sys.argv[1])
    body = zlib.compress(pickle.dumps("readonly"))
    frame = struct.pack("i", len(body)) + body
    with ThreadPoolExecutor(max_workers=max(1, 2 * len(args["raft"]))) as pool:
        framed = {a: pool.submit(_raft, a, frame) for a in args["raft"]}
        silent = {a: pool.submit(_raft, a, b"") for a in args["raft"]}
        tls = ClientTls(ca_file=os.environ["RAFTMQ_CA_FILE"])
        brokers = asyncio.run(_brokers(args["brokers"], args.get("ungranted"), tls))
        raft = {a: {"frame": framed[a].result(), "silent": silent[a].result()} for a in args["raft"]}
    print(json.dumps({"brokers": brokers, "raft": raft}))


if __name__ == "__main__":
    main()
