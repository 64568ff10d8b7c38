"""A name server's TOML file (``raftmq namesrv --config namesrv.toml``)::

    [namesrv]
    listen = "10.0.0.21:9876"            # HOST:PORT (--listen overrides it)
    # clock_skew_s = 60                  # how far a registration's timestamp may be from
                                         # this host's clock (keep the hosts on NTP)

    [namesrv.tls]                        # TLS (https://): the keys of broker/security/tls.py
    cert_file = "tls/namesrv1.pem"
    key_file = "tls/namesrv1.key"
    ca_file = "tls/ca.pem"

    [groups.g1]                          # one table per group served
    key_file = "/etc/raftmq/g1.namesrv-key"   # the group's registration key (64 hex digits),
                                              # written by `raftmq namesrv-key`; relative
                                              # paths are relative to this file

Unknown keys and wrong types are refused naming the file and the key (``msgspec``), as
for a replica's file. The name server never sees a group's Raft secret, only the key
derived from it (``broker.security.registration_auth``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import msgspec

from broker.security.registration_auth import SKEW_S, read_key_file
from broker.security.tls import TlsSection
from common.toml_config import ConfigError, read_section, read_toml

__all__ = ["NamesrvConfig", "read_namesrv_config", "write_namesrv_config"]

SECTIONS = ("namesrv", "groups")


class _NamesrvSection(msgspec.Struct, forbid_unknown_fields=True):
    listen: str = "127.0.0.1:9876"
    clock_skew_s: float = SKEW_S
    tls: TlsSection | None = None


class _GroupEntry(msgspec.Struct, forbid_unknown_fields=True):
    key_file: str


@dataclass(frozen=True, slots=True)
class NamesrvConfig:
    listen: str
    clock_skew_s: float
    keys: dict[str, bytes]  # group -> registration key
    tls: TlsSection | None = None  # paths relative to the file's directory already


def read_namesrv_config(path: Path) -> NamesrvConfig:
    """The checked file at ``path`` with every key file read; ConfigError says what to fix."""
    doc = read_toml(path, SECTIONS)
    section = read_section(path, doc, "namesrv", _NamesrvSection)
    tables = doc.get("groups", {})
    if not isinstance(tables, dict):
        raise ConfigError(f"{path}: groups must be tables ([groups.NAME] key_file = ...), not a value")
    groups = {g: read_section(path, {f"groups.{g}": t}, f"groups.{g}", _GroupEntry)
              for g, t in tables.items()}
    if not 1 <= section.clock_skew_s <= 3600:
        raise ConfigError(f"{path}: namesrv.clock_skew_s must be in 1..3600 seconds, "
                          f"not {section.clock_skew_s}")
    keys: dict[str, bytes] = {}
    for group, entry in groups.items():
        key_path = path.parent / entry.key_file
        try:
            keys[group] = read_key_file(key_path)
        except OSError as e:
            raise ConfigError(f"{path}: groups.{group}.key_file {key_path}: {e.strerror}") from None
        except ValueError as e:
            raise ConfigError(f"{path}: groups.{group}.key_file: {e}; write it with `raftmq "
                              f"namesrv-key --group {group} --secret-file SECRET --out FILE`") from None
    tls = section.tls.relative_to(path.parent) if section.tls is not None else None
    return NamesrvConfig(section.listen, section.clock_skew_s, keys, tls)


def write_namesrv_config(path: Path, listen: str, key_files: dict[str, Path],
                         tls: TlsSection | None = None) -> Path:
    """Write a name server's file serving ``key_files`` (group -> key file), with TLS
    when ``tls`` is given."""
    lines = ["[namesrv]", f'listen = "{listen}"', ""]
    if tls is not None:
        fields = msgspec.structs.asdict(tls)
        lines += ["[namesrv.tls]", *(f"{k} = {json.dumps(v)}" for k, v in fields.items()), ""]
    for group, key_file in sorted(key_files.items()):
        lines += [f"[groups.{group}]", f'key_file = "{key_file}"', ""]
    path.write_text("\n".join(lines))
    return path
