"""Client commands of ``raftmq``: topics, send, consume, query, consumer groups.

Where the cluster is, its TLS and who we are: ``client.cli_cluster``. Users and
policies: ``raftmq user`` and ``raftmq acl`` (``client.access_cli``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from client.access_cli import ACCESS_COMMANDS, add_access_commands
from client.aio import AsyncAdmin, AsyncProducer, AsyncPullConsumer
from client.cli_cluster import add_cluster_options, client_kwargs
from client.dead_letters import resend_copy
from client.errors import ClientError
from client.message import Message, ReceivedMessage

__all__ = ["CLIENT_COMMANDS", "add_client_commands", "run_client_command"]

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
    async with AsyncAdmin(**client_kwargs(args)) as admin:
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
    async with AsyncProducer(**client_kwargs(args), group=args.group) as p:
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
    where = client_kwargs(args)
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
    async with AsyncAdmin(**client_kwargs(args)) as admin:
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
    async with AsyncAdmin(**client_kwargs(args)) as admin:
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
    async with AsyncAdmin(**client_kwargs(args)) as admin:
        made = await admin.group_config(args.group, retry, args.max_deliveries, ordered=args.ordered)
    print(f"group {args.group}: retry after {' '.join(f'{s:g}s' for s in retry)}, at most "
          f"{args.max_deliveries} deliveries{', ordered' if args.ordered else ''}, on "
          f"{', '.join(g or 'the group' for g in made)}")
    return 0


async def _dlq(args: argparse.Namespace) -> int:
    """List or re-send a consumer group's dead letters (``%DLQ%group``)."""
    where = client_kwargs(args)
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
    add_cluster_options(t)

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
    add_cluster_options(s)


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
    add_cluster_options(c)

    q = sub.add_parser("query", help="find messages by id or key",
                       description="Look up messages by message id, or by key within a time range.")
    q.add_argument("topic")
    how = q.add_mutually_exclusive_group(required=True)
    how.add_argument("--id", help="message id (hex)")
    how.add_argument("--key", help="message key")
    q.add_argument("--begin", type=_time_ms, help="from this store time (ms or ISO)")
    q.add_argument("--end", type=_time_ms, help="until this store time (ms or ISO)")
    q.add_argument("--max", type=int, default=32, help="most results (default 32)")
    add_cluster_options(q)


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
    add_cluster_options(g)

    d = sub.add_parser("dlq", help="list or re-send a consumer group's dead letters",
                       description="Dead letters are messages a group failed to consume more than its "
                                   "max reconsume times (%%DLQ%%GROUP). resend sends each to its "
                                   "original topic (or --topic) and remembers progress.")
    d.add_argument("action", choices=["list", "resend"])
    d.add_argument("group", help="the consumer group whose dead letters to handle")
    d.add_argument("--topic", help="resend: to this topic instead of the original one")
    d.add_argument("--max", type=int, help="at most this many messages")
    add_cluster_options(d)


def add_client_commands(sub: Any) -> None:
    """The client commands of ``raftmq`` (module docstring), users and ACLs included."""
    _add_topic_and_send(sub)
    _add_consume_and_query(sub)
    _add_group_and_dlq(sub)
    add_access_commands(sub, add_cluster_options)


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
