"""The console's own page (issue 14, security gap a): a password typed at sign-in must not
cross the network in clear. Off loopback ``raftmq console`` refuses plain HTTP (exit 2,
an ``error:`` line) unless ``--insecure`` (a WARNING at start); with ``--listen-cert-file``
and ``--listen-key-file`` it serves https only, its session cookie marked Secure. No
cluster is needed: the console starts against an unreachable name server."""

from __future__ import annotations

import contextlib
import http.client
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftmq.local_tls import LocalCA
from tests.support.procs import stop_popen

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(60)]

_NOWHERE = ("--namesrv", "127.0.0.1:1", "--sample-interval", "5")


def _console(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "raftmq", "console", *_NOWHERE, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextlib.contextmanager
def _serving(*args: str) -> Iterator[tuple[str, int, list[str]]]:
    """A console listening: (scheme, port, its stderr lines once stopped -- filled on exit)."""
    proc = _console(*args)
    errors: list[str] = []
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("console at "), line + proc.stderr.read()  # type: ignore[union-attr]
        url = line.split()[2].rstrip("/")
        scheme, _, rest = url.partition("://")
        yield scheme, int(rest.rpartition(":")[2]), errors
    finally:
        stop_popen(proc)
        errors.extend(proc.stderr.read().splitlines())  # type: ignore[union-attr]


def test_off_loopback_plain_http_is_refused() -> None:
    done = subprocess.run([sys.executable, "-m", "raftmq", "console", *_NOWHERE, "--listen", "0.0.0.0:0"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error: the console listens on 0.0.0.0:0, which other hosts can reach, without TLS" in done.stderr
    assert "--listen-cert-file and --listen-key-file" in done.stderr and "--insecure" in done.stderr
    half = subprocess.run([sys.executable, "-m", "raftmq", "console", *_NOWHERE,
                           "--listen-cert-file", "x.pem"], capture_output=True, text=True, timeout=30)
    assert half.returncode == 2 and "go together" in half.stderr, half.stderr


def test_insecure_serves_plain_http_off_loopback_with_a_warning() -> None:
    with _serving("--listen", "0.0.0.0:0", "--insecure") as (scheme, _, errors):
        assert scheme == "http"
    warning = "INSECURE (--insecure): the console listens on 0.0.0.0:0 without TLS"
    assert any(warning in e for e in errors), errors


def test_with_a_certificate_the_page_is_served_over_https_only(tmp_path: Path) -> None:
    ca = LocalCA(tmp_path / "tls").ensure()
    served = ca.server_tls()
    with _serving("--listen", "0.0.0.0:0", "--listen-cert-file", served.cert_file,
                  "--listen-key-file", served.key_file) as (scheme, port, errors):
        assert scheme == "https"
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10,
                                           context=ssl.create_default_context(cafile=str(ca.ca_file)))
        conn.request("GET", "/")
        answer = conn.getresponse()
        assert answer.status == 200
        assert "Secure" in (answer.getheader("Set-Cookie") or ""), answer.getheaders()
        conn.close()
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        with pytest.raises((http.client.HTTPException, OSError)):
            plain.request("GET", "/")
            plain.getresponse()
        plain.close()
    assert not any("INSECURE" in e for e in errors), errors
