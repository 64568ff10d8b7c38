"""``raftmq replica init|forget|list|add|remove|replace``: form a group; change its members, one at a time.

    raftmq replica init --config node.toml       format an empty data directory as a founding
                                                 member of a NEW group (once, before its first start)
    raftmq replica forget --config node.toml     make a stopped replica's directory a new storage
                                                 (a restored backup): it votes once recorded
    raftmq replica list                          the members and who leads
    raftmq replica add n4 --raft H:P --client H:P
    raftmq replica remove n1
    raftmq replica replace n2 --name n6 --raft H:P --client H:P   (add n6, then remove n2)

Before ``add``, start the new replica with ``[group] join = true`` and ``peers`` listing
the current members and itself (``add`` prints the lines when it cannot reach it). It
catches up as a learner -- from the retained log, or the leader's snapshot when
retention deleted the start -- and ``add`` waits, showing how far behind it is, until
it is close enough to count for the majority. ``remove`` of the leader first hands the
leadership to another member. Each change is one Raft entry (the single-server change
of the Raft thesis); the replicas are found as for ``raftmq cluster status``
(``--dir``, ``--namesrv``) or with ``--servers``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from client.cli_cluster import add_tls_arguments
from client.errors import AuthFailedError
from raftmq.cluster_cmd import find_group
from raftmq.cluster_http import ClusterHttp
from raftmq.replica_forget import forget, node_group_config

__all__ = ["main"]


class CommandError(Exception):
    pass


class MemberLeads(CommandError):
    """The member to remove leads the group (again): hand the leadership over first."""


class Group:
    """The replicas of one group, and the newest member list any of them gave."""

    def __init__(self, addresses: list[str], http: ClusterHttp | None = None) -> None:
        self.http = http or ClusterHttp()
        self.addresses = list(dict.fromkeys(addresses))
        self.members: dict[str, dict[str, str]] = {}

    def leader(self, deadline: float) -> str:
        """The leader's broker address (waits for an election until ``deadline``). The member
        list is taken from the leader itself: a removed replica never learns it was removed."""
        while True:
            for address in list(self.addresses):
                doc = self._members_at(address)
                if doc is None:
                    continue
                named = doc.get("leader")
                client = doc["members"].get(named, {}).get("client") if named else None
                if not client:
                    continue
                own = doc if named == doc.get("node") else self._members_at(client)
                if own is not None and own.get("leader") == own.get("node") == named:
                    self.members = own["members"]
                    return str(client)
            if time.monotonic() >= deadline:
                raise CommandError("no replica of the group names a leader (is a majority up?)")
            time.sleep(0.3)

    def _members_at(self, address: str) -> dict[str, Any] | None:
        try:
            code, doc = self.http.call(address, "/admin/members", timeout=3)
        except OSError:
            return None
        if code in (401, 403):  # ACLs on: no user, or one without the right -- the same on every replica
            raise CommandError(doc.get("error", f"refused ({code})"))
        if code != 200:
            return None
        for m in doc["members"].values():
            if m["client"] and m["client"] not in self.addresses:
                self.addresses.append(m["client"])
        return doc

    def change(self, body: dict[str, Any], deadline: float, progress: bool = True) -> dict[str, Any]:
        """POST the change to the leader until it is made or ``deadline`` passes."""
        last_note = 0.0
        while True:
            leader = self.leader(deadline)
            try:
                code, doc = self.http.call(leader, "/admin/members", body)
            except OSError as e:
                code, doc = 0, {"error": f"cannot reach the leader at {leader}: {e}"}
            if code == 200:
                self.members = doc["members"]
                return doc
            if code == 400:
                raise CommandError(doc.get("error", "refused"))
            if code == 409 and doc.get("leads"):
                raise MemberLeads(doc.get("error", "the member leads"))
            now = time.monotonic()
            if now >= deadline:
                raise CommandError(f"gave up: {doc.get('error', code)}")
            if progress and now - last_note >= 2.0:
                print(f"  waiting: {doc.get('error', code)}", flush=True)
                last_note = now
            time.sleep(0.5)


def _print_members(members: dict[str, dict[str, str]], leader: str | None = None) -> None:
    for name, m in sorted(members.items()):
        mark = "  (leader)" if name == leader else ""
        print(f"  {name:<10} raft {m['raft']:<22} client {m['client'] or '?'}{mark}")


def _add(group: Group, name: str, raft: str, client: str, deadline: float) -> None:
    group.leader(deadline)
    try:
        code, status = group.http.call(client, "/status", timeout=3)
    except OSError:
        code, status = 0, {}
    if code != 200:
        peers = ", ".join([*(f'{n} = "{m["raft"]}"' for n, m in sorted(group.members.items())),
                           f'{name} = "{raft}"'])
        raise CommandError(
            f"{name}'s broker at {client} does not answer. Start it first with, in its config:\n"
            f"  [group]\n  peers = {{ {peers} }}\n  join = true\n"
            f"  [broker]\n  listen = \"{client}\"")
    print(f"adding {name} (raft {raft}): it catches up as a learner first", flush=True)
    group.change({"op": "add", "name": name, "raft": raft, "client": client}, deadline)
    while True:  # it counts for the majority now; wait until it knows it is a member
        try:
            code, status = group.http.call(client, "/status", timeout=3)
        except OSError:
            code = 0
        if code == 200 and status.get("member"):
            break
        if time.monotonic() >= deadline:
            raise CommandError(f"{name} was added but does not report itself a member yet")
        time.sleep(0.2)
    print(f"{name} is a member")


def _remove(group: Group, name: str, deadline: float) -> None:
    """Remove ``name``; a leader hands its role over first -- again if it got it back (an
    election may return it before the change is made)."""
    while True:
        leader = group.leader(deadline)
        if name not in group.members:
            raise CommandError(f"{name!r} is not a member ({', '.join(sorted(group.members))})")
        if group.members[name]["client"] == leader:
            print(f"{name} leads: handing the leadership over first", flush=True)
            code, doc = group.http.call(leader, "/admin/leader/transfer", {})  # the most up-to-date member
            if code != 200:
                if time.monotonic() >= deadline:
                    raise CommandError(f"leadership transfer failed: {doc.get('error', code)}")
                time.sleep(0.5)
            continue  # whoever leads now is asked
        try:
            group.change({"op": "remove", "name": name}, deadline)
            break
        except MemberLeads:
            if time.monotonic() >= deadline:
                raise
    print(f"{name} is no longer a member: stop its process (it no longer votes or receives entries) "
          "and remove its data directory once you no longer need it")


DESCRIPTION = ("Form a new group (init, on each founding replica before its first start), make a "
               "stopped replica's data directory a new storage that votes only once recorded (forget: "
               "a disk restored from a backup), or list or change a group's members, one replica at a "
               "time (Raft's single-server change): add, remove, or replace a host with a new address.")
EPILOG = ("init is for a NEW group only: a replica started on an empty data directory without it "
          "joins its group as a new storage, catching up before it votes -- which is how a replaced "
          "host (same name, empty disk) comes back. See docs/DEPLOY.md (form a group, grow, shrink, "
          "replace a host).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raftmq replica", description=DESCRIPTION, epilog=EPILOG)
    configure(parser)
    return run(parser.parse_args(argv))


def configure(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``raftmq replica``."""
    parser.add_argument("action", choices=["init", "forget", "list", "add", "remove", "replace"])
    parser.add_argument("--config", action="append", default=[], metavar="NODE_TOML",
                        help="init, forget: the replica's TOML (repeat for several replicas on this host)")
    parser.add_argument("name", nargs="?", help="add: the new replica's name; remove/replace: the "
                                                "member to remove")
    parser.add_argument("--name", dest="new_name", help="replace: the new replica's name")
    parser.add_argument("--raft", help="add/replace: the new replica's Raft address HOST:PORT")
    parser.add_argument("--client", help="add/replace: the new replica's broker address HOST:PORT")
    parser.add_argument("--group", help="the broker group (needed when there are several)")
    parser.add_argument("--dir", help="a local cluster's directory (its cluster.json)")
    parser.add_argument("--namesrv", help="find the replicas through this name server")
    parser.add_argument("--servers", help="replica broker addresses of the group, comma separated")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds to wait for catch-up and each change (default 600)")
    add_tls_arguments(parser)


def _init(configs: list[str]) -> int:
    """Format each replica's empty data directory as a founding storage of a new group."""
    from dledger.config import ConfigError
    from dledger.raft.storage_identity import StorageIdentityError, format_founder

    if not configs:
        raise SystemExit("raftmq replica: error: init needs --config NODE_TOML")
    failed = 0
    for path in configs:
        try:
            config = node_group_config(path)
            identity = format_founder(config.data_dir)
        except (ConfigError, StorageIdentityError, OSError, ValueError) as e:
            print(f"error: {path}: {e}", file=sys.stderr)
            failed += 1
            continue
        print(f"{config.node} of group {config.group}: {config.data_dir} formatted as founding storage "
              f"{identity.token}; start the replica now")
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    if args.action == "init":
        return _init(args.config)
    if args.action == "forget":
        return forget(args.config)
    problem = None
    if args.action != "list" and not args.name:
        problem = f"{args.action} needs the replica's name"
    elif args.action in ("add", "replace") and not (args.raft and args.client):
        problem = f"{args.action} needs --raft and --client of the new replica"
    elif args.action == "replace" and not args.new_name:
        problem = "replace needs --name of the new replica"
    if problem is not None:
        raise SystemExit(f"raftmq replica: error: {problem}")
    nodes = find_group(args)
    if nodes is None:
        return 1
    group = Group(list(nodes.values()), ClusterHttp.of(args))
    deadline = time.monotonic() + args.timeout
    try:
        if args.action == "add":
            _add(group, args.name, args.raft, args.client, deadline)
        elif args.action == "remove":
            _remove(group, args.name, deadline)
        elif args.action == "replace":
            _add(group, args.new_name, args.raft, args.client, deadline)
            _remove(group, args.name, deadline)
        leader = group.leader(deadline)
        names = {m["client"]: n for n, m in group.members.items()}
        print("members:")
        _print_members(group.members, names.get(leader))
    except (CommandError, AuthFailedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
