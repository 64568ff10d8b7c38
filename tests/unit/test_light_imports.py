"""The processes and tests that need no Raft load none: importing the in-memory log
(``dledger.local_log``) or the name server (``broker.namesrv.server``) in a fresh interpreter
leaves no ``pysyncobj`` module (nor ``dledger.raft.replicated_log``) in ``sys.modules``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(sys.modules)))
"""


def _loaded_by(module: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, module], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    return json.loads(done.stdout)


@pytest.mark.parametrize("module", ["dledger.local_log", "broker.namesrv.server"])
def test_importing_loads_no_raft_engine(module: str) -> None:
    loaded = _loaded_by(module)
    assert module in loaded  # the probe imported what it names
    heavy = [m for m in loaded if m.split(".")[0] == "pysyncobj" or m == "dledger.raft.replicated_log"]
    assert heavy == [], f"{module} loads the Raft engine: {heavy}"


def test_the_probe_sees_the_raft_engine_when_it_is_imported() -> None:
    assert "pysyncobj" in _loaded_by("dledger.raft.replicated_log")
