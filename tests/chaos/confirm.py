"""Evidence that a fault took effect: a scenario whose fault did nothing tested nothing.

Each helper waits (with a deadline) for what the fault must cause, records what it saw
in ``Scenario.confirmed`` (the report's "fault confirmed" column) and raises
:class:`FaultNotApplied` if it never came: a step-down, a follower's match index frozen
on the leader while the leader commits on, a delay or a reset seen by a request through
the faulted client link. The harness reads statuses directly (not through the proxies).
"""

from __future__ import annotations

import http.client
import ssl
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


#: what a reset toxic does to a request: the connection reset (or closed midway); a refusal
#: (nothing listens) or a timeout (a hung link) is some other fault, not the reset
_RESET = (ConnectionAbortedError, BrokenPipeError, http.client.IncompleteRead, ssl.SSLEOFError,
          ssl.SSLZeroReturnError)


def _probe(s: Scenario, link: Link, timeout: float) -> tuple[float, BaseException | None]:
    """(seconds, error or None) of one GET /status through ``link`` (a new connection; https
    when the group serves TLS)."""
    return _probe_address(s, link.listen, timeout)


def _probe_address(s: Scenario, address: str, timeout: float) -> tuple[float, BaseException | None]:
    began = time.monotonic()
    try:
        s.brokers.http.get(address, "/status", timeout)
        return time.monotonic() - began, None
    except (OSError, http.client.HTTPException, ValueError) as e:
        return time.monotonic() - began, e


def _cause(error: BaseException) -> BaseException:
    """The error under urllib's URLError wrapper."""
    reason = getattr(error, "reason", None)
    return reason if isinstance(error, urllib.error.URLError) and isinstance(reason, BaseException) else error


def _is_reset(error: BaseException) -> bool:
    return isinstance(_cause(error), (ConnectionResetError, *_RESET))


def _said(error: BaseException) -> str:
    return repr(_cause(error))[:120]


def delay_seen(s: Scenario, link: Link, at_least_s: float, attempts: int = 3) -> None:
    """A request through ``link`` is ANSWERED after ``at_least_s`` or more (the latency toxic
    acts). An error is no evidence of a delay: a dead node or a refused proxy fails at once,
    a hung link times out; up to ``attempts`` requests are tried for one answer."""
    errors: list[str] = []
    for _ in range(attempts):
        took, error = _probe(s, link, 10.0)
        if error is not None:
            errors.append(_said(error))
            continue
        if took < at_least_s:
            raise FaultNotApplied(f"fault not applied: a request through {link.name} took "
                                  f"{took * 1000:.0f} ms, under the {at_least_s * 1000:.0f} ms the latency "
                                  "toxic must add")
        _confirmed(s, f"a request through {link.name} took {took * 1000:.0f} ms (>= {at_least_s * 1000:.0f})")
        return
    raise FaultNotApplied(f"fault not applied: no request through {link.name} was answered, so no delay "
                          f"was seen ({attempts} tries: {errors})")


def reset_seen(s: Scenario, link: Link, attempts: int = 20, probe_timeout: float = 3.0) -> None:
    """A request through ``link`` has its connection reset (or, under TLS, closed midway)
    within ``attempts`` (the reset toxic acts) while the node behind it answers directly. A
    refusal, a timeout, or a reset with the node not answering (Toxiproxy resets what it
    cannot pass on) is some other fault: not counted."""
    other: list[str] = []
    for i in range(attempts):
        _, error = _probe(s, link, probe_timeout)
        if error is None:
            continue
        if _is_reset(error):
            # Toxiproxy also resets a connection it cannot pass on (its node dead): the
            # reset counts only if the node answers directly (the harness's own link)
            _, direct = _probe_address(s, link.upstream, probe_timeout)
            if direct is None:
                _confirmed(s, f"a request through {link.name} cut ({_said(error).split('(')[0]}) at try "
                              f"{i + 1}; its node answers directly")
                return
            other.append(f"{_said(error)} with the node not answering directly ({_said(direct)})")
            continue
        other.append(_said(error))
    raise FaultNotApplied(f"fault not applied: of {attempts} requests through {link.name} none was reset or "
                          f"closed midway ({len(other)} failed otherwise: {other[:3]})")
