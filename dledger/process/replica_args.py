"""The command line shared by every replica process (log node, broker) and opening its
replica from it (the process plumbing the name server shares too is ``common.process``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from common.process import configure_logging
from common.toml_config import ConfigError
from dledger.config import load_group_config
from dledger.raft.replicated_log import ReplicatedLog

__all__ = ["add_replica_arguments", "open_replica"]

T = TypeVar("T")


def add_replica_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, required=True, help="node TOML file")
    parser.add_argument("--insecure", action="store_true",
                        help="allow a group without a cluster secret (its Raft port then runs what it "
                             "is sent), and a broker listening where other hosts reach it without TLS "
                             "and ACLs (a WARNING at every start; tests only)")
    parser.add_argument("--repair-log", action="store_true",
                        help="cut the CommitLog at a corrupt record and re-fetch the rest")
    parser.add_argument("--log-level", default="INFO")


def open_replica(args: argparse.Namespace,
                 read_extra: Callable[[Path], T] = lambda _path: None,
                 sections: Iterable[str] = ("node", "group", "raft")) -> tuple[ReplicatedLog, T]:
    """Configure logging, load and check the config (and ``read_extra`` of the same file,
    whose top-level tables are ``sections``), open the replica. Any problem is printed as
    one ``error:`` line and exits with 2."""
    configure_logging(args.log_level)
    try:
        config = load_group_config(args.config, insecure=args.insecure, repair_log=args.repair_log,
                                   other_sections=[s for s in sections if s not in ("node", "group", "raft")])
        extra = read_extra(args.config)
        return ReplicatedLog(config), extra
    except (ConfigError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
    except Exception as e:  # CorruptLogError and friends: say it plainly
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
    raise SystemExit(2)
