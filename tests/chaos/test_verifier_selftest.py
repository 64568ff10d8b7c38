"""The checker can fail: the verifier against a deliberately broken broker and broken histories.

``test_unsafe_ack_build_is_caught`` runs the brokers as ``tests/support/unsafe_broker.py``
(the real broker whose leader's ``WritePath`` acknowledges a send as soon as it is
proposed, before a majority holds it) and cuts the leader from its peers while
clients still reach it. The old leader keeps acknowledging until its lease runs out;
those messages never commit. The scenario must end in a :class:`Violation` naming lost
acknowledged messages -- the same scenario passes on the real build
(``test_message_chaos.py::test_leader_cut_from_peers_while_clients_reach_it``).

The other tests feed the verifier small hand-made histories, one broken invariant each.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.chaos.scenario import Scenario
from tests.support.message_history import MessageHistory, Stored, Violation

pytestmark = pytest.mark.chaos


@pytest.mark.cluster
@pytest.mark.timeout(150)
def test_unsafe_ack_build_is_caught(make_scenario: Callable[..., Scenario],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    root = str(Path(__file__).resolve().parents[2])  # the broker processes import tests.support
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    s = make_scenario(entry="tests.support.unsafe_broker")
    s.expect_violation = True
    s.start()
    old = s.leader()
    acked_before = s.history.acked_count
    s.brokers.isolate(old, clients=False)
    cut_at = s.event(f"BROKEN BUILD: cut leader {old} from its peers (clients still reach it)")
    s.brokers.wait_status(old, lambda st: st["role"] != "leader", 10, "the cut leader stepping down")
    s.event(f"{old} stepped down; {s.history.acked_count - acked_before} sends acknowledged meanwhile")
    s.failover_after(cut_at)
    s.workload.wait_more_acked(200, 30)
    s.brokers.heal()
    s.event("healed")
    with pytest.raises(Violation, match="never delivered \\(lost\\)") as caught:
        s.finish()
    print(f"the verifier caught the broken build: {str(caught.value)[:400]}")
    figures = s.history.analyze()[0]
    assert figures["lost"] > 0


def _ok_history() -> MessageHistory:
    h = MessageHistory()
    for i in range(4):
        h.ok(f"k:{i}".encode(), "k", "q#0", i)
    for i in range(4):
        h.delivered(f"k:{i}".encode(), "q#0", i, "c1", 100 + i)
    rows = [Stored("q#0", i, f"k:{i}".encode(), 100 + i) for i in range(4)]
    h.stored("n1", rows)
    h.stored("n2", rows)
    return h


def test_a_clean_history_passes() -> None:
    figures = _ok_history().check(exactly_once=True, complete=True)
    assert figures["acked"] == 4 and figures["lost"] == 0


@pytest.mark.parametrize("breakage, expected", [
    ("lose", "never delivered"),
    ("reorder", "consumed before an earlier-sent one"),
    ("duplicate", "stored more than once"),
    ("redeliver", "delivered more than once"),
    ("unknown_twice", "stored more than once"),
    ("replicas_differ", "store different rows"),
    ("phantom", "not in the final log"),
    ("offset_back", "going back"),
    ("offset_back_in_log", "commits the offset of q#0 backwards"),
    ("failed_delivered", "reported failed were delivered"),
    ("gap", "differs from the acknowledged one"),
])
def test_each_broken_invariant_is_reported(breakage: str, expected: str) -> None:
    h = _ok_history()
    rows = list(h.replicas["n1"])
    if breakage == "lose":
        h.ok(b"k:4", "k", "q#0", 4)
    elif breakage == "reorder":
        h.deliveries[1], h.deliveries[2] = h.deliveries[2], h.deliveries[1]
    elif breakage == "duplicate":
        rows.append(Stored("q#0", 4, b"k:3", 104))
        h.stored("n1", rows)
        h.stored("n2", rows)
    elif breakage == "redeliver":
        h.delivered(b"k:3", "q#0", 3, "c1", 103)
    elif breakage == "unknown_twice":
        h.unknown(b"k:4", "k")
        rows += [Stored("q#0", 4, b"k:4", 104), Stored("q#0", 5, b"k:4", 105)]
        h.stored("n1", rows)
        h.stored("n2", rows)
    elif breakage == "replicas_differ":
        h.stored("n2", rows[:3])
    elif breakage == "phantom":
        h.delivered(b"k:4", "q#0", 4, "c1", 104)
        h.unknown(b"k:4", "k")
    elif breakage == "offset_back":
        for offset in (1, 3, 2):
            h.offset_seen("n1#1", "q#0", offset)
    elif breakage == "offset_back_in_log":
        h.offset_logged("q#0", [1, 3, 2])
    elif breakage == "failed_delivered":
        h.failed(b"k:4", "k")
        h.delivered(b"k:4", "q#0", 4, "c1", 104)
    elif breakage == "gap":  # k:1 acknowledged, k:0 and k:2 consumed, k:1 not
        h.deliveries.pop(1)
    with pytest.raises(Violation, match=expected):
        h.check(exactly_once=True, complete=True)
