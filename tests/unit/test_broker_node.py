"""The broker section of a node's config file."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.node import MAX_MESSAGE_BYTES_LIMIT, _broker_section
from dledger.config import ConfigError


def test_max_message_bytes_is_optional_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('[broker]\nlisten = "127.0.0.1:1"\n')
    assert "max_message_bytes" not in _broker_section(path)
    path.write_text('[broker]\nlisten = "127.0.0.1:1"\nmax_message_bytes = 8388608\n')
    assert _broker_section(path)["max_message_bytes"] == 8 << 20
    for bad in ("0", "\"4MiB\"", str(MAX_MESSAGE_BYTES_LIMIT + 1), "true"):
        path.write_text(f'[broker]\nlisten = "127.0.0.1:1"\nmax_message_bytes = {bad}\n')
        with pytest.raises(ConfigError, match="max_message_bytes must be an integer"):
            _broker_section(path)
