"""Evidence that a fault took effect: a scenario whose fault did nothing tested nothing.

Each helper waits (with a deadline) for what the fault must cause, records what it saw
in ``Scenario.confirmed`` (the report's "fault confirmed" column) and raises
:class:`FaultNotApplied` if it never came: a step-down, a follower's match index frozen
on the leader while the leader commits on, a delay or a reset seen by a request through
the faulted client link. The harness reads statuses directly (not through the proxies).
"""

from __future__ import annotations

import time
import urllib.error

from tests.chaos.scenario import Scenario
from tests.chaos.toxi import Link

__all__ = ["FaultNotApplied", "delay_seen", "match_frozen", "reset_seen", "stepped_down"]

#: entries the leader must commit past a frozen follower before the freeze counts
ENTRIES_PAST = 10


class FaultNotApplied(AssertionError):
    """The fault a scenario injected shows no effect."""


def _confirmed(s: Scenario, what: str) -> None:
    s.confirmed.append(what)
    s.event(f"fault confirmed: {what}")


def stepped_down(s: Scenario, node: str, timeout: float = 10.0) -> None:
    """``node`` (the leader the fault hit) stops leading within ``timeout``. Looked at after
    the failover was measured: the time said is from the fault to when it was seen."""
    began = time.monotonic()
    fault_at = s.last_fault_at
    try:
        s.brokers.wait_status(node, lambda st: st["role"] != "leader", timeout, "stepping down")
    except TimeoutError as e:
        raise FaultNotApplied(f"fault not applied: {node} still leads {timeout:g}s after the fault: "
                              f"{e}") from None
    seen = time.monotonic()
    since = f"{seen - fault_at:.2f}s after the fault" if fault_at is not None else f"in {seen - began:.2f}s"
    _confirmed(s, f"{node} was seen stepped down {since} (looked at once the failover was measured)")


def match_frozen(s: Scenario, leader: str, follower: str, *, own_log_frozen: bool = False,
                 timeout: float = 20.0) -> None:
    """While the leader commits ``ENTRIES_PAST`` more entries, its match index for ``follower``
    does not move (and, with ``own_log_frozen``, neither does the follower's own last index:
    nothing from the leader reaches it)."""
    b = s.brokers
    first = b.status(leader) or {}
    match0 = first.get("follower_match_index", {}).get(follower)
    own0 = (b.status(follower) or {}).get("last_index")
    if match0 is None or first.get("role") != "leader":
        raise FaultNotApplied(f"fault not applied: {leader} is not leading with {follower} as a follower "
                              f"({first.get('role')}, match {first.get('follower_match_index')})")
    target = int(first["commit_index"]) + ENTRIES_PAST
    last = b.wait_status(leader, lambda st: st["commit_index"] >= target, timeout,
                         f"committing {ENTRIES_PAST} entries past {follower}")
    match1 = last.get("follower_match_index", {}).get(follower)
    own1 = (b.status(follower) or {}).get("last_index")
    if match1 != match0:
        raise FaultNotApplied(f"fault not applied: {leader}'s match index for {follower} moved "
                              f"{match0} -> {match1} while it committed up to {last['commit_index']}")
    if own_log_frozen and own0 is not None and own1 is not None and own1 != own0:
        raise FaultNotApplied(f"fault not applied: {follower} still receives entries from {leader} "
                              f"(its last index {own0} -> {own1})")
    _confirmed(s, f"{follower}'s match index held at {match0} while {leader} committed "
                  f"{last['commit_index'] - target + ENTRIES_PAST} entries"
                  + (f", its own log at {own0}" if own_log_frozen else ""))


def _probe(s: Scenario, link: Link, timeout: float) -> tuple[float, str | None]:
    """(seconds, error or None) of one GET /status through ``link`` (a new connection; https
    when the group serves TLS)."""
    began = time.monotonic()
    try:
        s.brokers.http.get(link.listen, "/status", timeout)
        return time.monotonic() - began, None
    except (OSError, urllib.error.URLError, ValueError) as e:
        return time.monotonic() - began, repr(e)[:120]


def delay_seen(s: Scenario, link: Link, at_least_s: float) -> None:
    """A request through ``link`` takes ``at_least_s`` or more (the latency toxic acts)."""
    took, error = _probe(s, link, 10.0)
    if error is None and took < at_least_s:
        raise FaultNotApplied(f"fault not applied: a request through {link.name} took {took * 1000:.0f} ms, "
                              f"under the {at_least_s * 1000:.0f} ms the latency toxic must add")
    _confirmed(s, f"a request through {link.name} took {took * 1000:.0f} ms")


def reset_seen(s: Scenario, link: Link, attempts: int = 20) -> None:
    """A request through ``link`` is cut (connection reset or closed) within ``attempts``."""
    for i in range(attempts):
        _, error = _probe(s, link, 3.0)
        if error is not None:
            _confirmed(s, f"a request through {link.name} cut ({error.split('(')[0]}) at try {i + 1}")
            return
    raise FaultNotApplied(f"fault not applied: {attempts} requests through {link.name} all got answers")
