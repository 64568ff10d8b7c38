"""``raftmq user`` and ``raftmq acl``: users and access policies of the broker groups.

    raftmq user add NAME [--super]     the new password from $RAFTMQ_NEW_PASSWORD, --password-file,
    raftmq user passwd NAME            or typed twice at a prompt -- never on the command line
    raftmq user del NAME               the user and its policies
    raftmq user list
    raftmq user hash NAME [--out F]    a super user's SCRAM record for [broker] acl_bootstrap_file
                                       (offline: no cluster needed)
    raftmq user access-key create USER a RocketMQ access key of USER on every group: the access
                                       key and secret key printed once (AclClientRPCHook(AK, SK))
    raftmq user access-key list [USER] access keys and their users (never a secret)
    raftmq user access-key revoke AK
    raftmq acl grant USER RESOURCE ACTIONS [--deny] [--source CIDR]
    raftmq acl revoke USER RESOURCE [ACTIONS] [--deny] [--source CIDR]
    raftmq acl list [USER]

RESOURCE: ``cluster``, ``topic:NAME``, ``topic:PREFIX*``, ``topic:*``, ``group:...``;
ACTIONS: comma-separated of pub, sub, create, update, delete, get, list. Who runs these
authenticates as every client command does (RAFTMQ_USER and RAFTMQ_PASSWORD, or a
credentials file): a super user, or a user changing their own password.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from client.aio import AsyncAdmin
from client.credentials import scram_record
from protocol.acl import Action

__all__ = ["ACCESS_COMMANDS", "add_access_commands", "read_new_password"]

ENV_NEW_PASSWORD = "RAFTMQ_NEW_PASSWORD"


def read_new_password(args: argparse.Namespace) -> str:
    """The password to set: $RAFTMQ_NEW_PASSWORD, --password-file, or a prompt (twice)."""
    if args.password_file:
        lines = Path(args.password_file).read_text().splitlines()
        password = lines[0] if lines else ""
    elif os.environ.get(ENV_NEW_PASSWORD):
        password = os.environ[ENV_NEW_PASSWORD]
    else:
        if not sys.stdin.isatty():
            raise SystemExit(f"error: give the new password in ${ENV_NEW_PASSWORD}, with --password-file, "
                             "or at a terminal")
        password = getpass.getpass(f"new password for {args.name}: ")
        if getpass.getpass("again: ") != password:
            raise SystemExit("error: the passwords differ")
    if len(password) < 8:
        raise SystemExit("error: a password has at least 8 characters")
    return password


def _admin(args: argparse.Namespace) -> AsyncAdmin:
    from client.cli_cluster import client_kwargs  # the client commands' one way to find the cluster

    return AsyncAdmin(**client_kwargs(args))


async def _access_key(args: argparse.Namespace) -> int:
    verb, what = args.name, args.arg
    if verb not in ("create", "list", "revoke") or (verb != "list" and not what):
        raise SystemExit("error: user access-key create USER | list [USER] | revoke ACCESS_KEY")
    async with _admin(args) as admin:
        if verb == "create":
            access_key, secret_key, groups = await admin.access.create_access_key(what)
            if args.json:
                print(json.dumps({"user": what, "access_key": access_key, "secret_key": secret_key,
                                  "groups": groups}))
            else:
                print(f"access key {access_key} of {what} added on {', '.join(groups)}; its secret key, "
                      f"shown this once (no command shows it again):\n{secret_key}")
        elif verb == "revoke":
            groups = await admin.access.revoke_access_key(what)
            print(f"access key {what} revoked on {', '.join(groups)}")
        else:
            for row in await admin.access.list_access_keys(what):
                doc = {"access_key": row.access_key, "user": row.user, "created_ms": row.created_ms}
                print(json.dumps(doc) if args.json else f"{row.access_key:30} {row.user}")
    return 0


async def _user(args: argparse.Namespace) -> int:
    if args.action == "access-key":
        return await _access_key(args)
    if args.action == "hash":
        record = scram_record(read_new_password(args))
        doc = json.dumps({"user": args.name, "salt": record.salt.hex(), "iterations": record.iterations,
                          "stored_key": record.stored_key.hex(), "server_key": record.server_key.hex()})
        if args.out:
            Path(args.out).write_text(doc + "\n")
            os.chmod(args.out, 0o600)
            print(f"super user record of {args.name} written to {args.out}")
        else:
            print(doc)
        return 0
    async with _admin(args) as admin:
        if args.action in ("add", "passwd"):
            groups = await admin.access.put_user(args.name, read_new_password(args), super_user=args.super)
            done = "added" if args.action == "add" else "password set"
            print(f"user {args.name} {done} on {', '.join(groups)}")
        elif args.action == "del":
            groups = await admin.access.delete_user(args.name)
            print(f"user {args.name} deleted on {', '.join(groups)}")
        else:
            for row in await admin.access.users():
                print(json.dumps({"user": row.user, "super": row.super}) if args.json
                      else f"{row.user:30} {'super' if row.super else ''}")
    return 0


async def _acl(args: argparse.Namespace) -> int:
    async with _admin(args) as admin:
        if args.action == "list":
            for p in await admin.access.policies(args.user):
                if args.json:
                    print(json.dumps({"user": p.user, "resource": p.resource, "decision": p.decision,
                                      "source": p.source, "actions": list(p.actions)}))
                else:
                    print(f"{p.user:20} {p.decision:5} {','.join(p.actions):30} {p.resource}"
                          f"{'  from ' + p.source if p.source else ''}")
            return 0
        if not args.resource:
            raise SystemExit(f"error: acl {args.action} needs USER RESOURCE")
        actions = [a for a in (args.actions or "").split(",") if a]
        bad = [a for a in actions if a not in set(Action)]
        if bad or (args.action == "grant" and not actions):
            raise SystemExit(f"error: ACTIONS are comma-separated of {', '.join(Action)}; "
                             f"got {args.actions!r}")
        call = admin.access.grant if args.action == "grant" else admin.access.revoke
        groups = await call(args.user, args.resource, actions, deny=args.deny, source=args.source or "")
        print(f"{args.action} {'deny' if args.deny else 'allow'} {','.join(actions) or 'all'} on "
              f"{args.resource} for {args.user}: done on {', '.join(groups)}")
    return 0


def add_access_commands(sub: Any, where: Callable[[argparse.ArgumentParser], None]) -> None:
    u = sub.add_parser("user", help="add, delete or list users; set a password",
                       description="Users of the broker groups (SCRAM-SHA-256: brokers store no password). "
                                   f"A new password comes from ${ENV_NEW_PASSWORD}, --password-file or a "
                                   "prompt, never from the command line.")
    u.add_argument("action", choices=["add", "del", "list", "passwd", "hash", "access-key"])
    u.add_argument("name", nargs="?", help="user name (access-key: create, list or revoke)")
    u.add_argument("arg", nargs="?", help="access-key create/list: the user; revoke: the access key")
    u.add_argument("--super", action="store_true", help="add: a super user (every right)")
    u.add_argument("--password-file", help="add/passwd/hash: read the new password from this file")
    u.add_argument("--out", help="hash: write the record to this file (mode 0600)")
    where(u)
    a = sub.add_parser("acl", help="grant, revoke or list access policies",
                       description="Policies: USER may (or, --deny, may not) do ACTIONS on RESOURCE. "
                                   "RESOURCE: cluster, topic:NAME, topic:PREFIX*, topic:*, group:NAME, "
                                   "group:PREFIX*, group:*. ACTIONS: " + ",".join(Action) + ".")
    a.add_argument("action", choices=["grant", "revoke", "list"])
    a.add_argument("user", nargs="?", help="user name (list: only this user's)")
    a.add_argument("resource", nargs="?")
    a.add_argument("actions", nargs="?", help="comma-separated (revoke: none = every action)")
    a.add_argument("--deny", action="store_true", help="a deny statement (deny wins over allow)")
    a.add_argument("--source", help="only from this network (CIDR)")
    where(a)


def _check(args: argparse.Namespace) -> None:
    if args.cmd == "user" and args.action != "list" and not args.name:
        raise SystemExit(f"error: user {args.action} needs a NAME")


async def _run(args: argparse.Namespace) -> int:
    _check(args)
    return await (_user if args.cmd == "user" else _acl)(args)


ACCESS_COMMANDS: dict[str, Callable[[argparse.Namespace], Awaitable[int]]] = {"user": _run, "acl": _run}
