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

Inside the packages (``INSIDE``): processors see a ``BrokerContext``, never the server or
the HTTP layer; the name server imports neither the broker's storage and state nor dledger's
Raft or storage; dledger's storage imports only itself and ``common``; the ``Log`` API and
the memory log import no Raft; only ``dledger/raft/`` imports pysyncobj. Imports under
``TYPE_CHECKING`` count: they are the design's dependencies too.

Every import of a RaftMQ module names a file of this tree (the editable install would
otherwise serve a moved module's old path from another checkout), and the packages form no
import cycle, nor do dledger's and broker's folders (``__main__`` modules, which nothing imports, aside).

``KNOWN`` lists the imports that still break it. It may only shrink: a new crossing fails
here, and so does an entry that is no longer needed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
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


#: (files, what they may not import, why): a module matches a prefix when it is the prefix
#: or lies under it
INSIDE: list[tuple[str, tuple[str, ...], str]] = [
    ("broker/processors/*.py", ("broker.remoting", "broker.http_api", "broker.node"),
     "processors see a BrokerContext, not the server or the HTTP layer"),
    ("broker/http_api/*.py", ("broker.remoting", "broker.node"), "the HTTP endpoints see a ServerView"),
    ("broker/rocketmq/*.py", ("broker.remoting", "broker.http_api", "broker.node", "broker.namesrv"),
     "the RocketMQ front end sees a RocketBroker (or a route table)"),
    ("broker/security/*.py", ("broker.remoting", "broker.http_api", "broker.processors", "broker.node"),
     "access control sees an AccessServer"),
    ("broker/state/*.py", ("broker.remoting", "broker.http_api", "broker.processors", "broker.deferred",
                           "broker.replication", "broker.security"),
     "the apply step's state depends on the store's formats only"),
    ("broker/namesrv/*.py", ("broker.store", "broker.state", "broker.replication", "broker.processors",
                             "dledger.raft", "dledger.storage", "pysyncobj"),
     "the name server is stateless: no broker storage or state, no Raft"),
    ("common/*.py", tuple(p for p in PACKAGES if p != "common"), "shared utilities import nothing of RaftMQ"),
    *((f"dledger/{api}.py", ("dledger.raft", "dledger.process", "pysyncobj"),
       "the Log API and the memory log load no Raft")
      for api in ("log", "log_events", "log_reader", "log_status", "local_log", "errors", "config",
                  "membership", "latency", "stage_clock", "applier")),
]
#: (files, the only RaftMQ modules and pysyncobj they may import)
ONLY: list[tuple[str, tuple[str, ...], str]] = [
    ("dledger/storage/*.py", ("dledger.storage", "common"), "storage knows no Raft and no node role"),
]
#: the one folder that may import the Raft engine
ENGINE_ADAPTER = "dledger/raft/"


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _our_files() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def test_rules_inside_the_packages() -> None:
    broken = []
    for pattern, forbidden, why in INSIDE:
        for path in sorted(ROOT.glob(pattern)):
            broken += [(str(path.relative_to(ROOT)), m, why) for m in _imports(path) if _under(m, forbidden)]
    for pattern, allowed, why in ONLY:
        for path in sorted(ROOT.glob(pattern)):
            broken += [(str(path.relative_to(ROOT)), m, why) for m in _imports(path)
                       if m.split(".")[0] in (*PACKAGES, "pysyncobj") and not _under(m, allowed)]
    for path in _our_files():
        rel = str(path.relative_to(ROOT))
        if not rel.startswith(ENGINE_ADAPTER):
            broken += [(rel, m, "only dledger/raft/ imports pysyncobj") for m in _imports(path)
                       if _under(m, ("pysyncobj",))]
    assert broken == []


def test_an_import_under_type_checking_counts(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from broker.remoting.server import BrokerServer\n")
    assert "broker.remoting.server" in _imports(module)


def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _defined_in_init(package: str) -> set[str]:
    tree = ast.parse((ROOT.joinpath(*package.split(".")) / "__init__.py").read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom | ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
    return names


def test_every_import_of_ours_names_a_module_of_this_tree() -> None:
    ours = (*PACKAGES, "benchmarks", "tests")
    missing = []
    tools = [*sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "benchmarks").rglob("*.py"))]
    for path in [*_our_files(), *tools]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                wanted = [a.name for a in node.names
                          if a.name.split(".")[0] in ours and not _is_module(a.name)]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] in ours:
                if not _is_module(node.module):
                    wanted = [node.module]
                elif (ROOT.joinpath(*node.module.split(".")) / "__init__.py").is_file():
                    defined = _defined_in_init(node.module)
                    wanted = [f"{node.module}.{a.name}" for a in node.names
                              if not _is_module(f"{node.module}.{a.name}") and a.name not in defined]
                else:
                    wanted = []
            else:
                continue
            missing += [(str(path.relative_to(ROOT)), m) for m in wanted]
    assert missing == []


def _package_graph(depth: dict[str, int]) -> dict[str, set[str]]:
    """Package -> packages it imports, each cut to ``depth[top package]`` levels (1: the top
    package only); ``__main__`` modules left out (nothing imports them)."""
    def cut(dotted: str) -> str:
        parts = dotted.split(".")
        return ".".join(parts[:depth.get(parts[0], 1)])

    graph: dict[str, set[str]] = {}
    for path in _our_files():
        if path.name == "__main__.py":
            continue
        rel = path.relative_to(ROOT)
        source = cut(".".join(rel.parent.parts))
        for module in _imports(path):
            if module.split(".")[0] not in PACKAGES:
                continue
            target = cut(module if (ROOT.joinpath(*module.split(".")) / "__init__.py").is_file()
                         else module.rsplit(".", 1)[0])
            if target != source:
                graph.setdefault(source, set()).add(target)
    return graph


def _a_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` (the packages in order), or [] when it has none."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_no_import_cycle_between_packages() -> None:
    assert _a_cycle(_package_graph({})) == []  # the top-level packages
    assert _a_cycle(_package_graph({"dledger": 2})) == []  # dledger's API, storage, raft, process
    assert _a_cycle(_package_graph({"broker": 2})) == []  # broker's folders


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _a_cycle({"a": {"b"}, "b": {"c"}}) == []


#: a folder of ours holds at most this many modules directly (``__init__``/``__main__`` aside)
MODULES_PER_FOLDER = 20


def test_no_folder_holds_more_than_about_twenty_modules() -> None:
    crowded = {}
    for package in PACKAGES:
        for folder in [ROOT / package, *(p.parent for p in (ROOT / package).rglob("*/__init__.py"))]:
            modules = [m for m in folder.glob("*.py") if m.name not in ("__init__.py", "__main__.py")]
            if len(modules) > MODULES_PER_FOLDER:
                crowded[str(folder.relative_to(ROOT))] = len(modules)
    assert crowded == {}


#: the one place above dledger still reading ``Log.commitlog`` (the old name of ``Log.reader``):
#: broker/rocketmq was outside the change that moved the broker to the LogReader (dledger/log.py)
COMMITLOG_READERS = {"broker/rocketmq/admin.py", "broker/rocketmq/offsets.py"}


def _reaches_commitlog(source: str) -> bool:
    return any(isinstance(node, ast.Attribute) and node.attr == "commitlog"
               for node in ast.walk(ast.parse(source)))


def test_above_dledger_the_log_is_read_through_its_reader_not_the_concrete_commitlog() -> None:
    """``Log.reader`` (a ``dledger.log_reader.LogReader``) is the broker's way to records by
    position; ``.commitlog`` is the storage, dledger's own. Only ``COMMITLOG_READERS`` still
    use the old name, and the list may only shrink."""
    found = {str(path.relative_to(ROOT)) for package in ("broker", "spark", "raftmq", "console", "client")
             for path in (ROOT / package).rglob("*.py") if _reaches_commitlog(path.read_text())}
    assert found == COMMITLOG_READERS
    assert _reaches_commitlog("x = server.rlog.commitlog.start_position")
    assert not _reaches_commitlog("x = server.rlog.reader.start_position  # commitlog")
