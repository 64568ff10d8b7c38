"""Where a client command finds the cluster, over what TLS, and as whom: its options and their reading.

Where: ``--namesrv HOST:PORT`` (repeatable), ``--servers A,B,C`` (one group's nodes, no
name server), or ``--dir DIR`` (a cluster started by ``scripts/run`` or ``raftmq cluster
up``: its ``cluster.json`` names the name server). Without any, ``$RAFTMQ_NAMESRV``, then
``./run/cluster.json``, then RocketMQ's ``127.0.0.1:9876``.

TLS (``protocol.tls``): ``--ca-file`` (``--cert-file``/``--key-file`` for mutual TLS,
``--tls`` for the system's CAs); else a cluster found through a ``cluster.json`` uses the
CA and client certificate it names (``raftmq cluster up --tls``); else ``$RAFTMQ_CA_FILE``
and friends.

Who: a broker group with ACLs on needs a user, read from ``--credentials-file`` (two
lines: user, password), ``$RAFTMQ_CREDENTIALS_FILE``, or ``$RAFTMQ_USER`` and
``$RAFTMQ_PASSWORD`` -- never from argv.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from client.aio.routes import default_namesrv
from client.credentials import Credentials
from protocol.tls import ClientTls

__all__ = ["DEFAULT_RUN_DIR", "add_cluster_options", "add_tls_arguments", "cli_tls", "client_kwargs",
           "cluster_tls"]

DEFAULT_RUN_DIR = "run"


def client_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The client's keyword arguments: where the cluster is, and who we are."""
    try:
        credentials = Credentials.from_env(file=getattr(args, "credentials_file", None))
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: credentials: {e}") from None
    who = {} if credentials is None else {"credentials": credentials}
    return {**_cluster_address(args), **who}


def _cluster_address(args: argparse.Namespace) -> dict[str, Any]:
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


def add_cluster_options(p: argparse.ArgumentParser) -> None:
    """The options naming the cluster, its TLS and the output, common to every client command."""
    g = p.add_argument_group("cluster")
    g.add_argument("--namesrv", action="append", metavar="HOST:PORT", help="a name server (repeatable)")
    g.add_argument("--servers", metavar="A,B,C", help="one group's broker addresses (no name server)")
    g.add_argument("--dir", help="a local cluster's directory (its cluster.json names the name server)")
    g.add_argument("--credentials-file", metavar="FILE",
                   help="user name and password, one a line (else $RAFTMQ_USER, $RAFTMQ_PASSWORD)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_tls_arguments(p)
