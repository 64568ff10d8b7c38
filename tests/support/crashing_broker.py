"""A broker build that CRASHES ON ITS OWN, for the chaos suite's self-test (``python -m
tests.support.crashing_broker --config base/n2.toml ...``).

It is the real broker plus one thread: once the file ``base/n2.crash`` (the config's
path with the suffix ``.crash``) exists, the process deletes it (a crash happens once),
prints a traceback and exits with status 70 -- as a broker that dies under a fault
would, with nobody asking it to. The harness must report it
(``tests/chaos/node_health.py``), never restart it like a node the test killed.
Nothing in the production packages can turn it on.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from pathlib import Path

from broker.node import main

__all__ = ["CRASH_STATUS", "crash_file"]

CRASH_STATUS = 70


def crash_file(config: Path) -> Path:
    """The file whose appearance makes the node of ``config`` crash."""
    return config.with_suffix(".crash")


def _crash_when(trigger: Path) -> None:
    while not trigger.exists():
        time.sleep(0.05)
    trigger.unlink()  # once: started again, the node runs normally
    try:
        raise RuntimeError(f"TEST-ONLY CRASHING BUILD: {trigger.name} appeared")
    except RuntimeError:
        traceback.print_exc()
    sys.stderr.flush()
    os._exit(CRASH_STATUS)


if __name__ == "__main__":
    config = Path(sys.argv[sys.argv.index("--config") + 1])
    threading.Thread(target=_crash_when, args=(crash_file(config),), daemon=True).start()
    sys.exit(main())
