"""Client commands of ``raftmq``: topics, send, consume, query, consumer groups.

Where the cluster is: ``--namesrv HOST:PORT`` (repeatable), ``--servers A,B,C`` (one
group's nodes, no name server), or ``--dir DIR`` (a cluster started by ``scripts/run``
or ``raftmq cluster up``: its ``cluster.json`` names the name server). Without any,
``$RAFTMQ_NAMESRV``, then ``./run/cluster.json``, then RocketMQ's ``127.0.0.1:9876``.

TLS (``protocol.tls``): ``--ca-file`` (``--cert-file``/``--key-file`` for mutual TLS,
``--tls`` for the system's CAs); else a cluster found through a ``cluster.json`` uses the
CA and client certificate it names (``raftmq cluster up --tls``); else ``$RAFTMQ_CA_FILE``
and friends.

Who: a broker group with ACLs on needs a user. The commands read it from
``--credentials-file`` (two lines: user, password), ``$RAFTMQ_CREDENTIALS_FILE``, or
``$RAFTMQ_USER`` and ``$RAFTMQ_PASSWORD`` -- never from argv. Users and policies:
``raftmq user`` and ``raftmq acl`` (``client.access_cli``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from client.access_cli import ACCESS_COMMANDS, add_access_commands
from client.aio import AsyncAdmin, AsyncProducer, AsyncPullConsumer
from client.aio.routes import default_namesrv
from client.credentials import Credentials
from client.dead_letters import resend_copy
from client.errors import ClientError
from client.message import Message, ReceivedMessage
from protocol.tls import ClientTls

__all__ = ["CLIENT_COMMANDS", "add_client_commands", "add_tls_arguments", "cli_tls", "cluster_tls",
           "run_client_command"]

DEFAULT_RUN_DIR = "run"


def _where(args: argparse.Namespace) -> dict[str, Any]:
    """The client's keyword arguments: where the cluster is, and who we are."""
    try:
        credentials = Credentials.from_env(file=getattr(args, "credentials_file", None))
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: credentials: {e}") from None
    who = {} if credentials is None else {"credentials": credentials}
    return {**_cluster(args), **who}


def _cluster(args: argparse.Namespace) -> dict[str, Any]:
    if args.servers:
        return {"servers": [s.strip() for s in args.servers.split(",") if s.strip()], "tls": cli_tls(args)}
    if args.namesrv:
        return {"namesrv": args.namesrv, "tls": cli_tls(args)}
    if args.dir:
        state = Path(args.dir) / "cluster.json"
        if not state.exists():
            raise SystemExit(f"error: no cluster.json under {args.dir} (the directory of scripts/run or "
                             "`raftmq cluster up`)")
        doc = json.loads(state.read_text())
        return {"namesrv": [doc["namesrv"]["address"]], "tls": cli_tls(args, doc)}
    state = Path(DEFAULT_RUN_DIR) / "cluster.json"
    if not os.environ.get("RAFTMQ_NAMESRV") and state.exists():
        doc = json.loads(state.read_text())
        return {"namesrv": [doc["namesrv"]["address"]], "tls": cli_tls(args, doc)}
    return {"namesrv": default_namesrv(), "tls": cli_tls(args)}


def add_tls_arguments(parser: argparse.ArgumentParser,
                      tls_help: str = "TLS verified against the system's CAs ($RAFTMQ_TLS=1)") -> None:
    """``--tls`` (``tls_help`` says what it does), ``--ca-file``, ``--cert-file``, ``--key-file``
    (module docstring)."""
    g = parser.add_argument_group("TLS (a cluster serving wss:// and https://)")
    g.add_argument("--ca-file", metavar="PEM", help="verify the cluster's certificates against this CA "
                   "(default: $RAFTMQ_CA_FILE, or the CA a --dir's cluster.json names)")
    g.add_argument("--cert-file", metavar="PEM", help="this client's certificate, for mutual TLS "
                   "($RAFTMQ_CERT_FILE)")
    g.add_argument("--key-file", metavar="PEM", help="its private key ($RAFTMQ_KEY_FILE)")
    g.add_argument("--tls", action="store_true", help=tls_help)


def cluster_tls(state: dict[str, Any]) -> ClientTls | None:
    """The CA and client certificate a ``cluster.json`` names (``raftmq cluster up --tls``)."""
    tls = state.get("tls")
    if not tls:
        return None
    return ClientTls(tls.get("ca_file"), tls.get("cert_file"), tls.get("key_file"))


def cli_tls(args: argparse.Namespace, state: dict[str, Any] | None = None) -> ClientTls | bool | None:
    """A command's ``tls=``: its flags; else the ``state`` (a cluster.json) it found the cluster
    through (False when that names no TLS); else None: the environment decides."""
    ca, cert, key = (getattr(args, k, None) for k in ("ca_file", "cert_file", "key_file"))
    if ca or cert or getattr(args, "tls", False):
        return ClientTls(ca, cert, key)
    if state is not None:
        return cluster_tls(state) or False
    return None


def _time_ms(text: str) -> int:
    """Milliseconds since the epoch, or an ISO-8601 time (local time if no zone)."""
    if text.isdigit():
        return int(text)
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither milliseconds since the epoch nor an ISO time like "
            "2026-11-23T10:00") from None


def _show(m: ReceivedMessage, as_json: bool) -> str:
    if as_json:
        try:
            body: dict[str, str] = {"body": m.body.decode()}
        except UnicodeDecodeError:
            body = {"body_base64": base64.b64encode(m.body).decode()}
        return json.dumps({"msg_id": m.msg_id, "topic": m.topic, "group": m.queue.group,
                           "queue_id": m.queue_id, "queue_offset": m.queue_offset, "tags": m.tags,
                           "keys": list(m.keys), "properties": dict(m.properties),
                           "store_timestamp": m.store_timestamp, "born_timestamp": m.born_timestamp,
                           **body})
    stamp = datetime.fromtimestamp(m.store_timestamp / 1000).isoformat(timespec="milliseconds")
    body_text = m.body.decode(errors="replace")
    if len(body_text) > 200:
        body_text = body_text[:200] + f"... ({len(m.body)} bytes)"
    where = f"{m.queue}@{m.queue_offset}" if m.queue_offset >= 0 else str(m.queue)
    return f"{where} {stamp} id={m.msg_id} tags={m.tags} keys={list(m.keys)} {body_text}"


async def _topic(args: argparse.Namespace) -> int:
    async with AsyncAdmin(**_where(args)) as admin:
        if args.action == "create":
            groups = args.groups.split(",") if args.groups else None
            made = await admin.create_topic(args.name, args.queues, args.perm, groups)
            print(f"topic {args.name}: {args.queues} queues on {', '.join(g or 'the group' for g in made)}")
        elif args.action == "delete":
            gone = await admin.delete_topic(args.name, args.groups.split(",") if args.groups else None)
            print(f"topic {args.name} deleted on {', '.join(g or 'the group' for g in gone)}")
        else:
            topics = await admin.topics()
            if args.json:
                print(json.dumps(topics, indent=2))
            for name, by_group in topics.items():
                spread = ", ".join(f"{g}: {q} queues perm {p}" for g, (q, p) in sorted(by_group.items()))
                print(f"{name:30} {spread}")
    return 0


async def _send(args: argparse.Namespace) -> int:
    if args.body is not None:
        bodies = [args.body.encode()] * args.count
    elif args.file:
        bodies = [Path(args.file).read_bytes()] * args.count
    else:
        bodies = [line.rstrip(b"\n") for line in sys.stdin.buffer]
    keys = [k for k in (args.keys or "").split(",") if k]
    props = dict(p.split("=", 1) for p in args.property or [])
    failures = 0
    async with AsyncProducer(**_where(args), group=args.group) as p:
        for body in bodies:
            try:
                r = await p.send(Message(args.topic, body, args.tags, keys, props), shard_key=args.shard_key)
            except ClientError as e:
                failures += 1
                print(f"FAILED: {e}", file=sys.stderr)
                continue
            if args.json:
                print(json.dumps({"status": r.status.value, "msg_id": r.msg_id, "group": r.queue.group,
                                  "queue_id": r.queue_id, "queue_offset": r.queue_offset}))
            else:
                offset = r.queue_offset if r.queue_offset >= 0 else "(held: assigned at delivery)"
                print(f"{r.status.value} id={r.msg_id} queue={r.queue} offset={offset}")
    return 1 if failures else 0


async def _consume(args: argparse.Namespace) -> int:
    where = _where(args)
    c = AsyncPullConsumer(**where, group=args.group, read_from=args.read_from, selector=args.selector)
    shown = 0
    try:
        queues = await c.queues(args.topic)
        named = args.from_ in ("first", "last", "committed")
        start: str | int = args.from_ if named else _time_ms(args.from_)
        await c.assign(queues, start)
        idle_since = time.monotonic()
        while args.max is None or shown < args.max:
            # never more than still to show: the position (and so the commit) moves past
            # exactly what was printed
            room = 32 if args.max is None else min(32, args.max - shown)
            msgs = await c.poll(max_msgs=room, timeout=1.0)
            if not msgs:
                if args.idle is not None and time.monotonic() - idle_since >= args.idle:
                    break
                continue
            idle_since = time.monotonic()
            for m in msgs:
                print(_show(m, args.json), flush=True)
                shown += 1
                if args.max is not None and shown >= args.max:
                    break
            if args.commit:
                await c.commit()
    except KeyboardInterrupt:
        pass
    finally:
        if args.commit:
            await c.commit()
        await c.close()
    print(f"{shown} messages", file=sys.stderr)
    return 0


async def _query(args: argparse.Namespace) -> int:
    async with AsyncAdmin(**_where(args)) as admin:
        if args.id:
            m = await admin.message_by_id(args.topic, args.id)
            found = [m] if m else []
        else:
            found = await admin.messages_by_key(args.topic, args.key, args.begin or 0, args.end or 2**62,
                                                args.max)
    for m in found:
        print(_show(m, args.json))
    if not found:
        print("no message found", file=sys.stderr)
        return 1
    return 0


_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def durations_s(text: str) -> list[float]:
    """"1s 5s 30s 2m" -> [1.0, 5.0, 30.0, 120.0] (units ms, s, m, h; a bare number is seconds).
    Raises ValueError naming the token it cannot read."""
    out = []
    for token in text.replace(",", " ").split():
        number, unit = token.rstrip("smh"), token[len(token.rstrip("smh")):] or "s"
        try:
            out.append(float(number) * _UNIT_S[unit])
        except (KeyError, ValueError):
            raise ValueError(f"cannot read the duration {token!r} (e.g. 500ms, 5s, 2m, 1h)") from None
    if not out:
        raise ValueError("no duration given (e.g. --retry \"1s 5s 30s\")")
    return out


async def _group(args: argparse.Namespace) -> int:
    if args.action == "config":
        return await _group_config(args)
    if args.topic is None:
        print(f"raftmq group {args.action} needs a TOPIC", file=sys.stderr)
        return 2
    async with AsyncAdmin(**_where(args)) as admin:
        if args.action == "progress":
            rows = await admin.progress(args.group, args.topic)
            if args.json:
                print(json.dumps([{"queue": str(r.queue), "committed": r.committed,
                                   "min_offset": r.min_offset, "max_offset": r.max_offset, "lag": r.lag}
                                  for r in rows], indent=2))
                return 0
            print(f"{'queue':30} {'committed':>10} {'retained':>10} {'max':>10} {'lag':>10}")
            for r in rows:
                print(f"{r.queue!s:30} {r.committed if r.committed is not None else '-':>10} "
                      f"{r.min_offset:>10} {r.max_offset:>10} {r.lag:>10}")
            print(f"total lag {sum(r.lag for r in rows)}")
        else:
            offsets = await admin.reset_offsets(args.group, args.topic, _time_ms(args.to))
            for q, off in sorted(offsets.items()):
                print(f"{q!s:30} -> {off}")
    return 0


async def _group_config(args: argparse.Namespace) -> int:
    """A group's retry policy for SimpleConsumers (issue 29), through each broker group's log."""
    try:
        retry = durations_s(args.retry)
    except ValueError as e:
        print(f"--retry: {e}", file=sys.stderr)
        return 2
    async with AsyncAdmin(**_where(args)) as admin:
        made = await admin.group_config(args.group, retry, args.max_deliveries, ordered=args.ordered)
    print(f"group {args.group}: retry after {' '.join(f'{s:g}s' for s in retry)}, at most "
          f"{args.max_deliveries} deliveries{', ordered' if args.ordered else ''}, on "
          f"{', '.join(g or 'the group' for g in made)}")
    return 0


async def _dlq(args: argparse.Namespace) -> int:
    """List or re-send a consumer group's dead letters (``%DLQ%group``)."""
    where = _where(args)
    dlq = f"%DLQ%{args.group}"
    progress_group = f"{args.group}-dlq-resend"
    c = AsyncPullConsumer(**where, group=progress_group, read_from="any")
    moved = 0
    try:
        try:
            queues = await c.queues(dlq)
        except ClientError:
            print(f"group {args.group} has no dead letters ({dlq} does not exist)", file=sys.stderr)
            return 0
        await c.assign(queues, "committed" if args.action == "resend" else "first")
        async with AsyncProducer(**where, group="raftmq-dlq") as p:
            while args.max is None or moved < args.max:
                room = 32 if args.max is None else min(32, args.max - moved)
                msgs = await c.poll(max_msgs=room, timeout=1.0)
                if not msgs:
                    break
                for m in msgs:
                    if args.action == "list":
                        print(_show(m, args.json))
                    else:
                        r = await p.send(resend_copy(m, args.topic))
                        print(f"resent {m.msg_id} -> {r.queue}@{r.queue_offset} (new id {r.msg_id})")
                        await c.commit({m.queue: m.queue_offset + 1})
                    moved += 1
                    if args.max is not None and moved >= args.max:
                        break
    finally:
        await c.close()
    print(f"{moved} dead letters {'listed' if args.action == 'list' else 'resent'}", file=sys.stderr)
    return 0


def _add_cluster_options(p: argparse.ArgumentParser) -> None:
    """The options naming the cluster, its TLS and the output, common to every client command."""
    g = p.add_argument_group("cluster")
    g.add_argument("--namesrv", action="append", metavar="HOST:PORT", help="a name server (repeatable)")
    g.add_argument("--servers", metavar="A,B,C", help="one group's broker addresses (no name server)")
    g.add_argument("--dir", help="a local cluster's directory (its cluster.json names the name server)")
    g.add_argument("--credentials-file", metavar="FILE",
                   help="user name and password, one a line (else $RAFTMQ_USER, $RAFTMQ_PASSWORD)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_tls_arguments(p)


def _add_topic_and_send(sub: Any) -> None:
    """``raftmq topic`` and ``raftmq send``."""
    t = sub.add_parser("topic", help="create, list or delete topics",
                       description="Create (or update) a topic on every group, list topics, or delete "
                                   "one (its queues and offsets; messages go with retention).")
    t.add_argument("action", choices=["create", "list", "delete"])
    t.add_argument("name", nargs="?", help="topic name (create)")
    t.add_argument("--queues", type=int, default=8, help="queues per group (default 8)")
    t.add_argument("--perm", type=int, default=6, choices=[2, 4, 6], help="2 write, 4 read, 6 both (default)")
    t.add_argument("--groups", help="only these groups, comma-separated (default: all)")
    _add_cluster_options(t)

    s = sub.add_parser("send", help="send messages",
                       description="Send BODY (or --file, or one message per stdin line); prints each "
                                   "SEND_OK with its id, queue and offset.")
    s.add_argument("topic")
    s.add_argument("body", nargs="?", help="message body text (default: read lines from stdin)")
    s.add_argument("--file", help="send this file's bytes as the body")
    s.add_argument("--count", type=int, default=1, help="send BODY/--file this many times")
    s.add_argument("--tags", help="the message tag (consumers filter on it)")
    s.add_argument("--keys", help="comma-separated keys (query by key)")
    s.add_argument("--property", action="append", metavar="K=V", help="a user property (repeatable)")
    s.add_argument("--shard-key", help="messages with one shard key keep their order")
    s.add_argument("--group", default="raftmq-cli", help="producer group")
    _add_cluster_options(s)


def _add_consume_and_query(sub: Any) -> None:
    """``raftmq consume`` and ``raftmq query``."""
    c = sub.add_parser("consume", help="print messages of a topic",
                       description="Pull a topic's queues and print messages (Ctrl-C stops).")
    c.add_argument("topic")
    c.add_argument("--group", default="raftmq-cli", help="consumer group (offsets)")
    c.add_argument("--from", dest="from_", default="committed", metavar="WHERE",
                   help="committed (default; else first), first, last, or a time (ms or ISO)")
    c.add_argument("--selector", default="*", help='tags, e.g. "paid || created" (default *)')
    c.add_argument("--max", type=int, help="stop after this many messages")
    c.add_argument("--idle", type=float, help="stop after this many seconds without a message")
    c.add_argument("--commit", action="store_true", help="commit the group's offsets as we go")
    c.add_argument("--read-from", default="follower", choices=["follower", "leader", "any"])
    _add_cluster_options(c)

    q = sub.add_parser("query", help="find messages by id or key",
                       description="Look up messages by message id, or by key within a time range.")
    q.add_argument("topic")
    how = q.add_mutually_exclusive_group(required=True)
    how.add_argument("--id", help="message id (hex)")
    how.add_argument("--key", help="message key")
    q.add_argument("--begin", type=_time_ms, help="from this store time (ms or ISO)")
    q.add_argument("--end", type=_time_ms, help="until this store time (ms or ISO)")
    q.add_argument("--max", type=int, default=32, help="most results (default 32)")
    _add_cluster_options(q)


def _add_group_and_dlq(sub: Any) -> None:
    """``raftmq group`` and ``raftmq dlq``."""
    g = sub.add_parser("group", help="consumer group progress, offset reset, retry policy",
                       description="progress: committed offset, max offset and lag per queue; "
                                   "reset: move the group's offsets to a time; config: the group's "
                                   "retry policy for SimpleConsumers (kept in the log).")
    g.add_argument("action", choices=["progress", "reset", "config"])
    g.add_argument("group")
    g.add_argument("topic", nargs="?", help="progress, reset: the topic")
    g.add_argument("--to", help="reset: a time (ms since the epoch or ISO)")
    g.add_argument("--retry", default="1s 5s 10s 30s 60s",
                   help='config: the backoff of a nacked message, per delivery (default "1s 5s 10s 30s 60s")')
    g.add_argument("--max-deliveries", type=int, default=16,
                   help="config: deliveries before a message goes to %%DLQ%%GROUP (default 16)")
    g.add_argument("--ordered", action="store_true",
                   help="config: hand out a queue's messages one at a time, in order (each shard key "
                        "in order)")
    _add_cluster_options(g)

    d = sub.add_parser("dlq", help="list or re-send a consumer group's dead letters",
                       description="Dead letters are messages a group failed to consume more than its "
                                   "max reconsume times (%%DLQ%%GROUP). resend sends each to its "
                                   "original topic (or --topic) and remembers progress.")
    d.add_argument("action", choices=["list", "resend"])
    d.add_argument("group", help="the consumer group whose dead letters to handle")
    d.add_argument("--topic", help="resend: to this topic instead of the original one")
    d.add_argument("--max", type=int, help="at most this many messages")
    _add_cluster_options(d)


def add_client_commands(sub: Any) -> None:
    """The client commands of ``raftmq`` (module docstring), users and ACLs included."""
    _add_topic_and_send(sub)
    _add_consume_and_query(sub)
    _add_group_and_dlq(sub)
    add_access_commands(sub, _add_cluster_options)


_COMMANDS: dict[str, Callable[[argparse.Namespace], Awaitable[int]]] = {
    "topic": _topic, "send": _send, "consume": _consume, "query": _query, "group": _group, "dlq": _dlq,
    **ACCESS_COMMANDS}
CLIENT_COMMANDS = frozenset(_COMMANDS)


def run_client_command(args: argparse.Namespace) -> int:
    if args.cmd == "topic" and args.action in ("create", "delete") and not args.name:
        raise SystemExit(f"error: topic {args.action} needs a NAME")
    if args.cmd == "group" and args.action == "reset" and not args.to:
        raise SystemExit("error: group reset needs --to TIME")
    try:
        return asyncio.run(_COMMANDS[args.cmd](args))
    except ClientError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
