"""Our thin layer over Toxiproxy for the chaos tests.

Everything talks to 127.0.0.1 only. Contracts:

* every HTTP call has a timeout (``Toxi(timeout=5.0)``), sends a non-browser
  User-Agent (the server answers 403 to ``Mozilla/...``) and ignores ``*_proxy``
  environment variables;
* any answer >= 400 from the server, and any transport failure, becomes a
  :class:`ToxiproxyError` carrying the HTTP status (``None`` for transport errors)
  and the response body -- including the 500s the toxiproxy-python client lets through;
* ``Link.toxic(...)``, ``Link.partitioned(...)`` and ``Link.down()`` undo themselves on
  exit, also when the body raises; undoing something already undone (by ``heal()`` or
  ``Toxi.reset()``) is not an error.

The proxy/toxic calls go through ``toxiproxy.api.APIConsumer`` from the
toxiproxy-python package (0.1.1, its last release; last commit 2019, written against
Toxiproxy 2.1). Its ``Toxiproxy``/``Proxy`` classes do not suffice for these tests:
they call ``requests`` without a timeout and cannot be given one (nor a User-Agent or
"no environment proxies"), ``Toxiproxy.create`` turns the 500 of a busy port into
``KeyError: 'name'`` (after an extra ``GET /proxies``), and ``Proxy.add_toxic``
returns nothing; so we pass ``timeout=`` and the headers to the consumer ourselves.
That consumer keeps ONE global host/port, so each call sets it under a module lock:
several ``Toxi`` objects aimed at different servers stay correct, but their calls are
serialised. The server health probe uses ``urllib`` so that
starting a server touches no global state.
"""

from __future__ import annotations

import json
import secrets
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from tempfile import mkdtemp
from typing import Any, Literal

import requests
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from tests.support.procs import ManagedProcess, wait_until

__all__ = [
    "Link",
    "Stream",
    "Toxi",
    "ToxiproxyError",
    "ToxiproxyMissing",
    "ToxiproxyServer",
    "toxiproxy_binary",
]

HOST = "127.0.0.1"
USER_AGENT = "raftmq-chaos-tests/1.0"
HTTP_TIMEOUT_S = 5.0
START_TIMEOUT_S = 10.0
REPO_ROOT = Path(__file__).resolve().parents[2]

Stream = Literal["upstream", "downstream", "both"]
"""``upstream`` = client -> server bytes, ``downstream`` = server -> client bytes."""

_NO_PROXIES = {"http": None, "https": None, "all": None}
_CLIENT_STATUS = {ProxyExists: 409, NotFound: 404, InvalidToxic: 400}
_CLIENT_LOCK = threading.Lock()
_API_FAILED = "Server finished with error"  # logged when the API cannot listen


class ToxiproxyError(Exception):
    """The server refused a request (``status`` >= 400) or could not be reached (``None``)."""

    def __init__(self, method: str, path: str, status: int | None, body: str) -> None:
        self.method = method.upper()
        self.path = path
        self.status = status
        self.body = body
        what = f"HTTP {status}" if status is not None else "no answer"
        super().__init__(f"toxiproxy {self.method} {path}: {what}: {body}")


class ToxiproxyMissing(FileNotFoundError):
    """The toxiproxy-server binary has not been built."""


def toxiproxy_binary(root: Path = REPO_ROOT) -> Path:
    """Return ``<root>/.venv/bin/toxiproxy-server`` or raise :class:`ToxiproxyMissing`."""
    binary = root / ".venv" / "bin" / "toxiproxy-server"
    if not binary.is_file():
        raise ToxiproxyMissing(
            f"{binary} not found: run scripts/bootstrap (it builds toxiproxy-server "
            "v2.12.0 with `go install`; needs Go >= 1.23)"
        )
    return binary


def _as_text(body: bytes | str) -> str:
    return body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)


class _Http:
    """JSON calls to one Toxiproxy API through the toxiproxy-python consumer."""

    def __init__(self, port: int, timeout: float) -> None:
        self.port = port
        self.timeout = timeout

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """Send one request; return the decoded JSON answer (``None`` if empty)."""
        kwargs: dict[str, Any] = {
            "timeout": self.timeout,
            "headers": {"User-Agent": USER_AGENT},
            "proxies": dict(_NO_PROXIES),
        }
        if body is not None:
            kwargs["json"] = body
        with _CLIENT_LOCK:
            APIConsumer.host, APIConsumer.port = HOST, self.port
            try:
                response = getattr(APIConsumer, method)(path, **kwargs)
            except (ProxyExists, NotFound, InvalidToxic) as exc:
                status = _CLIENT_STATUS[type(exc)]
                raise ToxiproxyError(method, path, status, _as_text(exc.args[0])) from None
            except requests.RequestException as exc:
                raise ToxiproxyError(method, path, None, repr(exc)) from exc
        if response.status_code >= 400:
            raise ToxiproxyError(method, path, response.status_code, response.text)
        return response.json() if response.content else None


def _streams(stream: Stream) -> tuple[str, ...]:
    if stream == "both":
        return ("upstream", "downstream")
    if stream in ("upstream", "downstream"):
        return (stream,)
    raise ValueError(f"stream must be upstream, downstream or both, not {stream!r}")


class Link:
    """One proxy: clients connect to ``listen``, Toxiproxy forwards to ``upstream``.

    Toxic adders take ``stream`` (``both`` adds one toxic per direction) and return the
    names of the toxics added. Toxics also act on connections that are already open.
    """

    def __init__(self, http: _Http, name: str, listen: str, upstream: str) -> None:
        self._http = http
        self.name = name
        self.listen = listen
        self.upstream = upstream

    def __repr__(self) -> str:
        return f"<Link {self.name} {self.listen} -> {self.upstream}>"

    @property
    def listen_port(self) -> int:
        """The port clients connect to."""
        return int(self.listen.rsplit(":", 1)[1])

    # -- generic toxics -------------------------------------------------------------

    def add_toxic(
        self,
        kind: str,
        *,
        stream: Stream = "downstream",
        toxicity: float = 1.0,
        name: str | None = None,
        **attributes: Any,
    ) -> list[str]:
        """Add a toxic of type ``kind`` (named ``name`` or ``<kind>_<stream>``).

        With ``stream="both"`` the names get a ``_upstream``/``_downstream`` suffix, and
        if the second toxic fails the first is removed again before the error propagates.
        """
        added: list[str] = []
        try:
            for direction in _streams(stream):
                single = name is not None and stream != "both"
                toxic_name = name if single else f"{name or kind}_{direction}"
                self._http.call("post", f"/proxies/{self.name}/toxics", {
                    "name": toxic_name, "type": kind, "stream": direction,
                    "toxicity": toxicity, "attributes": attributes,
                })
                added.append(toxic_name)
        except BaseException:
            self.remove_toxics(added)
            raise
        return added

    def remove_toxics(self, names: list[str]) -> None:
        """Remove the named toxics; ones already gone are ignored."""
        for toxic_name in names:
            try:
                self._http.call("delete", f"/proxies/{self.name}/toxics/{toxic_name}")
            except ToxiproxyError as exc:
                if exc.status != 404:
                    raise

    def toxics(self) -> list[dict[str, Any]]:
        """The toxics currently on this link, as the server describes them."""
        return list(self._http.call("get", f"/proxies/{self.name}/toxics"))

    @contextmanager
    def toxic(self, kind: str, **options: Any) -> Iterator[list[str]]:
        """Context manager: :meth:`add_toxic` (same arguments), yield the names, always
        remove them."""
        names = self.add_toxic(kind, **options)
        try:
            yield names
        finally:
            self.remove_toxics(names)

    # -- named faults ---------------------------------------------------------------

    def cut(self, stream: Stream = "both") -> list[str]:
        """Partition: ``timeout`` toxic with timeout 0 -- bytes are swallowed and the
        connections hang (nothing is refused or closed). Idempotent per stream."""
        names = []
        for direction in _streams(stream):
            try:
                names += self.add_toxic("timeout", stream=direction, name=f"cut_{direction}",
                                        timeout=0)
            except ToxiproxyError as exc:
                if exc.status != 409:
                    raise
                names.append(f"cut_{direction}")
        return names

    def heal(self) -> None:
        """Remove every toxic of this link (does not re-enable a disabled link)."""
        self.remove_toxics([t["name"] for t in self.toxics()])

    def latency(self, ms: int, jitter: int = 0, stream: Stream = "downstream") -> list[str]:
        """Delay each chunk by ``ms`` +/- ``jitter`` ms (order is kept)."""
        return self.add_toxic("latency", stream=stream, latency=ms, jitter=jitter)

    def reset_peer(
        self, toxicity: float = 1.0, *, timeout_ms: int = 0, stream: Stream = "downstream"
    ) -> list[str]:
        """TCP RST ``timeout_ms`` after data arrives on ``stream``, on a ``toxicity``
        fraction of connections. ``downstream``: the request reached the server and the
        client sees a reset (outcome unknown); ``upstream``: the request is dropped."""
        return self.add_toxic("reset_peer", stream=stream, toxicity=toxicity,
                              timeout=timeout_ms)

    def disable(self) -> None:
        """Crashed host: close open connections and stop listening (connection refused)."""
        self._set_enabled(False)

    def enable(self) -> None:
        """Listen again on the same address."""
        self._set_enabled(True)

    @contextmanager
    def partitioned(self, stream: Stream = "both") -> Iterator[Link]:
        """Context manager: :meth:`cut` on entry, remove those cut toxics on exit."""
        names = self.cut(stream)
        try:
            yield self
        finally:
            self.remove_toxics(names)

    @contextmanager
    def down(self) -> Iterator[Link]:
        """Context manager: :meth:`disable` on entry, :meth:`enable` on exit."""
        self.disable()
        try:
            yield self
        finally:
            self.enable()

    def destroy(self) -> None:
        """Delete this proxy (closing its connections); already gone is fine."""
        try:
            self._http.call("delete", f"/proxies/{self.name}")
        except ToxiproxyError as exc:
            if exc.status != 404:
                raise

    def _set_enabled(self, enabled: bool) -> None:
        # POST is deprecated in favour of PATCH but still accepted by v2.12.0, and it is
        # the only update verb the toxiproxy-python consumer has.
        self._http.call("post", f"/proxies/{self.name}", {"enabled": enabled})


class Toxi:
    """Client of one Toxiproxy server on 127.0.0.1:``api_port``."""

    def __init__(self, api_port: int, timeout: float = HTTP_TIMEOUT_S) -> None:
        self.api_port = api_port
        self._http = _Http(api_port, timeout)

    def version(self) -> str:
        """The server's version string ("git" for a plain ``go install`` build)."""
        return str(self._http.call("get", "/version")["version"])

    def proxy(self, name: str, listen_port: int, upstream_port: int) -> Link:
        """Create an enabled proxy 127.0.0.1:``listen_port`` -> 127.0.0.1:``upstream_port``.

        ``listen_port`` 0 lets the server pick; ``Link.listen`` holds the real address.
        A duplicate name is a 409 and a busy port a 500 :class:`ToxiproxyError`.
        """
        info = self._http.call("post", "/proxies", {
            "name": name, "listen": f"{HOST}:{listen_port}",
            "upstream": f"{HOST}:{upstream_port}", "enabled": True,
        })
        return Link(self._http, info["name"], info["listen"], info["upstream"])

    def proxies(self) -> dict[str, dict[str, Any]]:
        """Every proxy on the server, by name, as the server describes it."""
        return dict(self._http.call("get", "/proxies"))

    def reset(self) -> None:
        """Heal everything: enable every proxy and remove every toxic."""
        self._http.call("post", "/reset")

    def destroy_all(self) -> None:
        """Delete every proxy (closing its connections); ones already gone are ignored."""
        for name, info in self.proxies().items():
            Link(self._http, name, info["listen"], info["upstream"]).destroy()


def _get_version(port: int, timeout: float, user_agent: str = USER_AGENT) -> str:
    """GET /version with urllib (no environment proxies); raises on any failure."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(f"http://{HOST}:{port}/version",
                                     headers={"User-Agent": user_agent})
    with opener.open(request, timeout=timeout) as response:
        return str(json.loads(response.read())["version"])


class ToxiproxyServer(ManagedProcess):
    """A ``toxiproxy-server`` process on 127.0.0.1:``port``, ready when constructed.

    The constructor starts the process and waits up to ``start_timeout`` s until
    ``/version`` answers *and* the answer came from this process (the probe's unique
    User-Agent shows up in its request log -- toxiproxy-server does not exit when its API
    port is taken, so another server could answer instead). On failure the process is
    stopped and a ``RuntimeError`` with the log tail is raised. ``stop()`` (and leaving
    the ``with`` block, also on an exception) terminates it by PID. Logs are appended to
    ``log_dir/toxiproxy.log`` (a fresh temporary directory by default).
    """

    def __init__(
        self,
        binary: Path,
        port: int,
        log_dir: Path | None = None,
        start_timeout: float = START_TIMEOUT_S,
    ) -> None:
        self.binary = Path(binary)
        self.port = port
        log_dir = Path(log_dir) if log_dir is not None else Path(mkdtemp(prefix="toxiproxy-"))
        log_path = log_dir / "toxiproxy.log"
        self._log_start = log_path.stat().st_size if log_path.exists() else 0
        super().__init__(
            [self.binary, "-host", HOST, "-port", str(port)],
            log_path, name="toxiproxy-server",
            env={"LOG_LEVEL": "debug"},  # request lines, which _wait_ready relies on
        )
        try:
            self.version = self._wait_ready(start_timeout)
        except BaseException:
            self.stop()
            raise

    def __repr__(self) -> str:
        return f"<ToxiproxyServer {HOST}:{self.port} pid={self.pid}>"

    def client(self) -> Toxi:
        """A :class:`Toxi` aimed at this server."""
        return Toxi(self.port)

    def _wait_ready(self, timeout: float) -> str:
        token = f"startup-probe-{secrets.token_hex(6)}"

        def state() -> str | None:
            if not self.alive:
                return f"exited with {self.returncode} before answering"
            if _API_FAILED in self._log():
                return "failed to serve its API (port taken?)"
            version = _get_version(self.port, timeout=1.0, user_agent=f"{USER_AGENT} {token}")
            return f"ready {version}" if token in self._log() else None

        try:
            outcome = wait_until(state, timeout, what=f"toxiproxy-server on {HOST}:{self.port} "
                                 "to answer /version itself")
        except TimeoutError as exc:
            raise self._start_error(str(exc)) from exc
        if not outcome.startswith("ready "):
            raise self._start_error(f"toxiproxy-server {outcome}")
        return outcome.removeprefix("ready ")

    def _log(self) -> str:
        """What this run of the server has logged so far."""
        with open(self.log_path, "rb") as log:
            log.seek(self._log_start)
            return log.read().decode("utf-8", "replace")

    def _start_error(self, message: str) -> RuntimeError:
        return RuntimeError(f"{message}\n--- {self.log_path} (tail) ---\n{self.log_tail()}")
