"""The soak (``scripts/soak``; not part of the suite): ordered load with retention active,
the randomized nemesis, and every ``--soak-replace-every`` seconds a follower's host
replaced (killed, data directory deleted, restarted empty). Retention keeps about a
minute of messages: a consumer behind the retained start skips what was deleted (with a
warning), which the verifier would count as lost. Every minute the disk use of
each replica (CommitLog, derived files, snapshots) is printed and recorded; the end is the
chaos suite's verdict (no loss, no duplicate, order per shard key, replicas equal, state
digests equal, ConsumeQueues equal unit by unit).

Run it with ``scripts/soak [MINUTES]`` (default 60). It is named ``soak_scenario.py`` so
that a plain ``pytest`` does not collect it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dledger.config import MAX_ENTRY_BYTES
from tests.chaos.nemesis import Nemesis
from tests.chaos.scenario import Scenario

pytestmark = [pytest.mark.chaos, pytest.mark.cluster]


def _bytes_under(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def disk_use(s: Scenario) -> dict[str, dict[str, float]]:
    """MiB per replica: CommitLog, ConsumeQueues + IndexFiles, snapshots."""
    out = {}
    for name in s.brokers.names:
        base = s.brokers.base / name
        out[name] = {"commitlog": _bytes_under(base / "commitlog") / 2**20,
                     "derived": (_bytes_under(base / "store" / "consumequeue")
                                 + _bytes_under(base / "store" / "index")) / 2**20,
                     "snapshots": _bytes_under(base / "store" / "snapshots") / 2**20}
    return out


def test_soak(make_scenario: Callable[..., Scenario], chaos_duration: float,
              request: pytest.FixtureRequest) -> None:
    replace_every = float(request.config.getoption("--soak-replace-every", 600.0) or 600.0)
    # a size cap of ~10 MiB: about a minute of this load, so consumers stalled by a fault
    # (and restarted during it) are never behind the retained start
    s = make_scenario(retention={"retention_bytes": 160 * MAX_ENTRY_BYTES}, read_from="any",
                      send_timeout=5.0).start()
    nemesis = Nemesis(s)
    end = time.monotonic() + chaos_duration
    next_replace = time.monotonic() + replace_every
    samples: list[tuple[float, dict[str, dict[str, float]]]] = []
    while time.monotonic() < end:
        nemesis.run(min(60.0, max(1.0, end - time.monotonic())))
        if time.monotonic() >= next_replace:
            next_replace += replace_every
            victim = s.rng.choice([n for n in s.brokers.names if n != s.leader()])
            s.brokers.kill(victim)
            s.brokers.wipe(victim)
            s.event(f"soak: {victim}'s host replaced (killed, data deleted)")
            s.restart(victim)
            s.brokers.wait_status(victim, lambda st: st["voter"] is True, 30, f"{victim}'s storage recorded")
            s.event(f"soak: {victim}'s new storage recorded: it votes again")
        use = disk_use(s)
        samples.append((round(time.monotonic() - s.started), use))
        s.event("soak: disk MiB " + ", ".join(
            f"{n} log {u['commitlog']:.1f} derived {u['derived']:.1f} snap {u['snapshots']:.2f}"
            for n, u in use.items()))
    s.workload.wait_more_acked(200, 30)
    s.notes.append(f"disk samples (s, MiB per replica): {samples}")
    s.finish(exactly_once=False)  # consumer restarts may redeliver what was not committed yet
