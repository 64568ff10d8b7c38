"""``raftmq cluster verify``: every group's replicas compared at a marker its leader
proposes for the purpose (``broker.http_api.verify``), and what they report besides.

Per group, in order:

    health        a replica whose /status says it is unhealthy (divergent, apply stalled)
    periodic      the state digests every replica records at snapshots and every 4096
                  entries (``/status`` ``state_digests``), compared where two hold one
    marker        POST /admin/verify on the leader: every replica digests its derived state
                  and reads back its ConsumeQueue units at the marker's entry; the leader
                  compares them (replicas and queues named)

Exit status: 0 every replica compared and equal; 1 a difference (a digest that differs,
an unhealthy replica); 2 something could not be compared (no leader, a replica down,
behind or without a digest) and nothing differs.
"""

from __future__ import annotations

import urllib.error
from collections.abc import Mapping
from typing import Any

from client.errors import AuthFailedError
from raftmq.cluster_http import ClusterHttp

__all__ = ["EXIT_INCOMPLETE", "EXIT_MISMATCH", "verify_groups"]

EXIT_MISMATCH = 1
EXIT_INCOMPLETE = 2
HTTP_SLACK_S = 30.0  # beyond the replicas' deadline, for the leader's answer


class _Tally:
    def __init__(self) -> None:
        self.mismatches = 0
        self.not_compared = 0


def verify_groups(groups: Mapping[str, Mapping[str, str]], http: ClusterHttp, timeout: float) -> int:
    """Verify every group of ``groups`` (group -> node -> client address), printing what
    was compared; the exit status (module docstring). ``timeout``: the seconds each
    replica has to apply the marker and digest at it."""
    tally = _Tally()
    for group, nodes in groups.items():
        statuses = {n: _status(http, a) for n, a in nodes.items()}
        _health(group, statuses, tally)
        _periodic(group, statuses, tally)
        _marker(group, nodes, statuses, http, timeout, tally)
    if tally.mismatches:
        print(f"verify: MISMATCH: {_count(tally.mismatches, 'difference')}")
        return EXIT_MISMATCH
    if tally.not_compared:
        print(f"verify: INCOMPLETE: {_count(tally.not_compared, 'item')} above could not be compared")
        return EXIT_INCOMPLETE
    print("verify: OK")
    return 0


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _status(http: ClusterHttp, address: str) -> dict[str, Any] | None:
    try:
        return dict(http.get(address, "/status", timeout=2))
    except (OSError, ValueError):
        return None


def _health(group: str, statuses: Mapping[str, dict[str, Any] | None], tally: _Tally) -> None:
    for node, s in statuses.items():
        if s is not None and not s.get("healthy", True):
            tally.mismatches += 1
            why = s.get("apply_stalled") or "its state differs from its peers'"
            print(f"{group}/{node}: UNHEALTHY: {why}")


def _periodic(group: str, statuses: Mapping[str, dict[str, Any] | None], tally: _Tally) -> None:
    digests = {n: s.get("state_digests", {}) for n, s in statuses.items() if s is not None}
    compared = 0
    for index in sorted({int(i) for d in digests.values() for i in d}):
        held = {n: d[str(index)] for n, d in digests.items() if str(index) in d}
        if len(held) < 2:
            continue
        compared += 1
        if len(set(held.values())) > 1:
            tally.mismatches += 1
            shown = ", ".join(f"{n} {d[:12]}" for n, d in sorted(held.items()))
            print(f"{group}: state digests DIFFER at index {index}: {shown}")
    print(f"{group}: recorded state digests compared at {compared} indexes")


def _marker(group: str, nodes: Mapping[str, str], statuses: Mapping[str, dict[str, Any] | None],
            http: ClusterHttp, timeout: float, tally: _Tally) -> None:
    leader = next((n for n, s in statuses.items() if s is not None and s.get("role") == "leader"), None)
    if leader is None:
        tally.not_compared += 1
        down = [n for n, s in statuses.items() if s is None]
        print(f"{group}: could not compare: no replica says it leads"
              + (f" ({', '.join(down)} do not answer)" if down else " (an election under way?)"))
        return
    try:
        code, doc = http.call(nodes[leader], "/admin/verify", {"timeout_s": timeout},
                              timeout=timeout + HTTP_SLACK_S)
    except (OSError, urllib.error.URLError, AuthFailedError) as e:
        tally.not_compared += 1
        print(f"{group}: could not compare: the leader {leader} at {nodes[leader]}: {e}")
        return
    if code != 200:
        tally.not_compared += 1
        why = ("it does not know /admin/verify (a broker older than this command)" if code == 404
               else doc.get("error") or doc.get("message") or f"HTTP {code}")
        print(f"{group}: could not compare: the leader {leader} answered {why}")
        return
    _print_comparison(group, doc, tally)


def _print_comparison(group: str, doc: Mapping[str, Any], tally: _Tally) -> None:
    index = doc["index"]
    at = f"at index {index} (marker)" if not doc.get("from_position") else \
        f"at index {index} (marker; ConsumeQueue units from CommitLog position {doc['from_position']})"
    for m in doc.get("mismatches", []):
        tally.mismatches += 1
        named = m["replicas"]
        who = f"replica {named[0]}" if len(named) == 1 else f"replicas {', '.join(named)}"
        print(f"{group}: MISMATCH {at}: {who}: {m['detail']}")
    for node, why in doc.get("not_compared", []):
        tally.not_compared += 1
        print(f"{group}: could not compare replica {node} {at}: {why}")
    compared = doc.get("compared", [])
    if len(compared) < 2:
        tally.not_compared += 0 if doc.get("not_compared") else 1
        print(f"{group}: compared {_count(len(compared), 'replica')} {at}: nothing to compare with")
        return
    found = doc.get("mismatches", [])
    verdict = "equal" if not found else _count(len(found), "MISMATCH", "MISMATCHES")
    print(f"{group}: compared {len(compared)} replicas {at}: {doc['queues']} queues, "
          f"{doc['units']} ConsumeQueue units; {verdict}")
