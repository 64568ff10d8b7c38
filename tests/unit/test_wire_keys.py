"""The wire's keys and layouts live in ``protocol/`` only (issue 14).

Outside ``protocol/``, the code of every other package (broker, client, spark, dledger,
raftmq, ...) must not:
spell a camelCase ext key (``"queueId"``, ``"nextOffset"`` ...: every key of every class
in ``protocol.catalog``); read a frame's ext (``.ext``); build a frame's ext or body by
hand (``Frame.request``, ``Frame(...)`` or ``.response(...)`` with more than a code and a
remark); or import msgpack where frames are handled. A plain word that is also a key
(``"topic"``) is caught by the last three rules wherever it could reach a frame.
"""

from __future__ import annotations

import ast
from pathlib import Path

from protocol.catalog import CATALOG
from protocol.pull import LeaderlessMark
from protocol.wire import NotLeaderResponse, WireBody, _spec

ROOT = Path(__file__).resolve().parents[2]
#: every top-level package but protocol itself (and the tests, which also speak raw frames
#: on purpose: old peers' bytes)
PACKAGES = tuple(sorted(p.parent.name for p in ROOT.glob("*/__init__.py")
                        if p.parent.name not in ("protocol", "tests")))
#: modules that handle frames: their bodies go through protocol's classes, never msgpack
FRAME_MODULES = ("client/**/*.py", "spark/**/*.py", "console/**/*.py", "broker/processors/*.py",
                 "broker/remoting/server.py", "broker/http_api/admin.py", "broker/namesrv/server.py",
                 "broker/deferred/service.py")
#: the same spelling, not a frame's key: (file, key) -> what it is
ALLOWED = {("broker/http_api/admin.py", "msgId"): "the query parameter of GET /admin/messages?msgId="}


def _wire_keys() -> set[str]:
    classes: set[type[WireBody]] = {c for pair in CATALOG.values() for c in pair if c is not None}
    classes |= {NotLeaderResponse, LeaderlessMark}
    return {f.key for c in classes for f in _spec(c).ext}


CAMEL_KEYS = {k for k in _wire_keys() if k != k.lower()}


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_key_list_and_the_packages_are_not_empty() -> None:
    assert {"queueId", "nextOffset", "leaderAddress", "maxReconsumeTimes"} <= CAMEL_KEYS
    assert {"broker", "client", "spark", "dledger", "raftmq"} <= set(PACKAGES)


def test_no_wire_key_is_spelled_outside_protocol() -> None:
    found = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in CAMEL_KEYS \
                    and (_rel(path), node.value) not in ALLOWED:
                found.append(f"{_rel(path)}:{node.lineno}: {node.value!r}")
    assert not found, "wire keys outside protocol/ (use the request/response classes):\n" + "\n".join(found)


def test_no_frame_ext_or_body_is_built_or_read_by_hand() -> None:
    found = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{_rel(path)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Attribute) and node.attr == "ext":
                found.append(f"{where}: reads .ext")
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            owner = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
            keywords = {k.arg for k in node.keywords}
            if name == "request" and owner == "Frame":
                found.append(f"{where}: Frame.request")
            elif name == "Frame" and (len(node.args) > 4 or keywords & {"ext", "body"}):
                found.append(f"{where}: Frame(...) with ext or body")
            elif name == "response" and (len(node.args) > 1 or keywords - {"remark"}):
                found.append(f"{where}: .response(...) with ext or body")
    assert not found, "frames built or read by hand outside protocol/:\n" + "\n".join(found)


def test_frame_handling_modules_do_not_use_msgpack() -> None:
    found = []
    for pattern in FRAME_MODULES:
        for path in ROOT.glob(pattern):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if any(n.split(".")[0] == "msgpack" for n in names):
                    found.append(_rel(path))
    assert not found, f"msgpack imported where frames are handled: {sorted(found)}"
