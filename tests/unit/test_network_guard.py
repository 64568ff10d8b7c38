"""The unit tests' network guard (tests/unit/conftest.py): an unmarked test cannot bind or
connect an IP socket; a test marked ``sockets`` can; local socket pairs stay allowed."""

from __future__ import annotations

import socket

import pytest

from tests.unit.conftest import NetworkForbidden


def test_an_unmarked_test_cannot_bind_or_connect(no_network_unless_marked: list[str]) -> None:
    with socket.socket() as sock, pytest.raises(NetworkForbidden):
        sock.bind(("127.0.0.1", 0))
    with socket.socket() as sock, pytest.raises(NetworkForbidden):
        sock.connect(("127.0.0.1", 1))
    assert len(no_network_unless_marked) == 2  # teardown would fail this test with them
    no_network_unless_marked.clear()


def test_a_socket_pair_is_not_the_network() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"x")
        assert right.recv(1) == b"x"


@pytest.mark.sockets
def test_a_marked_test_may_bind() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        assert sock.getsockname()[1] > 0
