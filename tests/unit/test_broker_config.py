"""The [broker] section of a replica's config file (broker/config.py) and the typed
checks every section gets: unknown keys and wrong types are refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import MAX_MESSAGE_BYTES_LIMIT, read_broker_section
from dledger.config import ConfigError, load_group_config
from protocol.message_format import MAX_MESSAGE_BYTES

GROUP = '[node]\nname = "n1"\n[group]\npeers = { n1 = "127.0.0.1:7001" }\nsecret = "s"\n'


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(text)
    return path


def test_max_message_bytes_is_optional_and_checked(tmp_path: Path) -> None:
    path = write(tmp_path, '[broker]\nlisten = "127.0.0.1:1"\n')
    section = read_broker_section(path)
    assert section.max_message_bytes == MAX_MESSAGE_BYTES and section.server_options() == {
        "max_message_bytes": MAX_MESSAGE_BYTES}
    write(tmp_path, '[broker]\nlisten = "127.0.0.1:1"\nmax_message_bytes = 8388608\nretry_overdue_s = 30\n')
    assert read_broker_section(path).server_options() == {"max_message_bytes": 8 << 20, "retry_overdue_s": 30}
    for bad, why in (("0", "must be in 1.."), (str(MAX_MESSAGE_BYTES_LIMIT + 1), "must be in 1.."),
                     ('"4MiB"', "Expected `int`, got `str`"), ("true", "Expected `int`, got `bool`")):
        write(tmp_path, f'[broker]\nlisten = "127.0.0.1:1"\nmax_message_bytes = {bad}\n')
        with pytest.raises(ConfigError, match=f"node.toml: broker.max_message_bytes.*{why}"):
            read_broker_section(path)


def test_a_misspelt_key_is_refused_naming_the_file_the_section_and_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, '[broker]\nlisten = "127.0.0.1:1"\nindex_slot = 64\n')
    with pytest.raises(ConfigError, match=r"node.toml: \[broker\] has no key 'index_slot' \(the keys of "
                                          r"\[broker\] are: listen, .*index_slots"):
        read_broker_section(path)
    write(tmp_path, GROUP + '[raft]\nretention_byte = 1\n')
    with pytest.raises(ConfigError, match=r"\[raft\] has no key 'retention_byte'.*retention_bytes"):
        load_group_config(path)
    write(tmp_path, GROUP + '[raft]\nsegment_bytes = "1 GiB"\n')
    with pytest.raises(ConfigError, match=r"raft.segment_bytes: Expected `int`, got `str`"):
        load_group_config(path)
    write(tmp_path, GROUP + '[raft]\nelection_timeout_ms = [400]\n')
    with pytest.raises(ConfigError, match=r"raft.election_timeout_ms: Expected `array` of length 2"):
        load_group_config(path)


def test_sections_are_known(tmp_path: Path) -> None:
    path = write(tmp_path, GROUP + '[brokr]\nlisten = "127.0.0.1:1"\n')
    with pytest.raises(ConfigError, match=r"unknown section \[brokr\] \(known: \[node\], \[group\]"):
        load_group_config(path)
    write(tmp_path, GROUP + '[broker]\nlisten = "127.0.0.1:1"\n')
    assert load_group_config(path, other_sections=["broker"]).node == "n1"
    assert read_broker_section(path).listen == "127.0.0.1:1"
    write(tmp_path, 'raft = 3\n' + GROUP + '[broker]\nlisten = "127.0.0.1:1"\n')
    with pytest.raises(ConfigError, match=r"raft must be a section"):
        load_group_config(path, other_sections=["broker"])


def test_acl_settings_are_checked(tmp_path: Path) -> None:
    assert not read_broker_section(write(tmp_path, '[broker]\nlisten = "127.0.0.1:1"\n')).acl
    path = write(tmp_path, '[broker]\nlisten = "127.0.0.1:1"\nacl = true\nacl_token_ttl_s = 30\n')
    assert read_broker_section(path).server_options() == {"max_message_bytes": MAX_MESSAGE_BYTES, "acl": True,
                                                          "acl_token_ttl_s": 30}
    for bad, why in (('acl_bootstrap_file = "missing.scram"', "acl_bootstrap_file"),
                     ("acl_token_ttl_s = 0", "acl_token_ttl_s")):
        write(tmp_path, f'[broker]\nlisten = "127.0.0.1:1"\nacl = true\n{bad}\n')
        with pytest.raises(ConfigError, match=why):
            read_broker_section(path)
    (tmp_path / "bad.scram").write_text('{"user": "admin"}')
    write(tmp_path, '[broker]\nlisten = "127.0.0.1:1"\nacl_bootstrap_file = "bad.scram"\n')
    with pytest.raises(ConfigError, match="not a super user record"):
        read_broker_section(path)


def test_the_client_ports_bounds_are_optional_and_checked(tmp_path: Path) -> None:
    from broker.remoting.client_limits import ClientLimits

    path = write(tmp_path, '[broker]\nlisten = "127.0.0.1:1"\nmax_connections = 100\nfd_reserve = 64\n'
                           'frame_deadline_s = 5\nidle_timeout_s = 10.5\n')
    limits = read_broker_section(path).server_options()["limits"]
    assert limits == ClientLimits(max_connections=100, fd_reserve=64, frame_deadline_s=5.0,
                                  idle_timeout_s=10.5)
    for bad, why in (("max_connections = 0", "max_connections must be a positive number"),
                     ("max_parked_pulls = -1", "max_parked_pulls must be a positive number"),
                     ("frame_deadline_s = 500", "frame_deadline_s .* is above idle_timeout_s"),
                     ('fd_reserve = "many"', "fd_reserve: Expected `int`, got `str`")):
        write(tmp_path, f'[broker]\nlisten = "127.0.0.1:1"\n{bad}\n')
        with pytest.raises(ConfigError, match=f"node.toml: broker.{why}"):
            read_broker_section(path)
