"""The layering contract (docs/ARCHITECTURE.md), read from every module's imports:

    raftmq    ->  anything                     the command line and local-cluster tools;
                                               nothing imports it
    common    <-  everything                   shared utilities (TOML, HTTP errors, throttled
                                               logs, process plumbing, durable files):
                                               common imports nothing of RaftMQ
    protocol  <-  broker, client, spark        protocol imports nothing of RaftMQ
    dledger   <-  broker                       dledger imports none of broker, client, spark, protocol
    client, spark never import broker; broker never imports client
    console   ->  client, protocol             the web console: the client and HTTP only
    benchmarks, tests                          the checkout's tools: no package imports them

``KNOWN`` lists the imports that still break it. It may only shrink: a new crossing fails
here, and so does an entry that is no longer needed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "protocol", "dledger", "broker", "client", "spark", "raftmq", "console")
FORBIDDEN = {
    "common": {"protocol", "dledger", "broker", "client", "spark", "raftmq", "console"},
    "protocol": {"dledger", "broker", "client", "spark", "raftmq", "console"},
    "dledger": {"protocol", "broker", "client", "spark", "raftmq", "console"},
    "broker": {"client", "spark", "raftmq", "console"},
    "client": {"broker", "dledger", "spark", "raftmq", "console"},
    "spark": {"broker", "dledger", "raftmq", "console"},
    "console": {"broker", "dledger", "spark", "raftmq"},
    "raftmq": set(),
}
#: tools of the checkout, never imported by an installed package
for _forbidden in FORBIDDEN.values():
    _forbidden.update({"benchmarks", "tests"})
KNOWN: set[tuple[str, str]] = set()


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def crossings() -> set[tuple[str, str]]:
    out = set()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for module in _imports(path):
                if module.split(".")[0] in FORBIDDEN[package]:
                    out.add((str(path.relative_to(ROOT)), module))
    return out


def test_the_packages_import_only_down_the_layers() -> None:
    found = crossings()
    assert not found - KNOWN, f"new imports across the layers: {sorted(found - KNOWN)}"
    assert not KNOWN - found, f"no longer needed, remove from KNOWN: {sorted(KNOWN - found)}"
