"""A broker data directory records its store format; one of another format is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.store.format import STORE_FORMAT, StoreFormatError, check_store_format


def test_a_new_directory_is_marked_and_accepted_again(tmp_path: Path) -> None:
    check_store_format(tmp_path)
    assert (tmp_path / "FORMAT").read_text() == f"raftmq-broker-store {STORE_FORMAT}\n"
    (tmp_path / "store" / "consumequeue" / "t").mkdir(parents=True)
    check_store_format(tmp_path)


def test_a_store_of_format_1_is_refused_with_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "state.checkpoint").write_bytes(b"old")
    with pytest.raises(StoreFormatError, match=r"store format 1; this broker reads format 2 only.*move"):
        check_store_format(tmp_path)
    assert not (tmp_path / "FORMAT").exists()


def test_another_format_number_or_a_foreign_marker_is_refused(tmp_path: Path) -> None:
    (tmp_path / "FORMAT").write_text("raftmq-broker-store 3\n")
    with pytest.raises(StoreFormatError, match="store format 3"):
        check_store_format(tmp_path)
    (tmp_path / "FORMAT").write_text("something else\n")
    with pytest.raises(StoreFormatError, match="not a RaftMQ store format marker"):
        check_store_format(tmp_path)
