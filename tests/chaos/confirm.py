"""Evidence that a fault took effect: a scenario whose fault did nothing tested nothing.

Each helper waits (with a deadline) for what the fault must cause, records what it saw
in ``Scenario.confirmed`` (the report's "fault confirmed" column) and raises
:class:`FaultNotApplied` if it never came: a step-down (``stepped_down``), a follower's
match index frozen on the leader while the leader commits on (``match_frozen``,
``cut_acted``), a read served by a cut follower through its client link (``read_served``),
an answered request delayed or a connection reset through the faulted client link
(``delay_seen``, ``reset_seen``: an error of another kind is no evidence), or -- for a cut
between two followers, which shows no effect until an election -- the toxic on their link
(``toxic_on``). The harness reads statuses directly (not through the proxies).
"""

from __future__ import annotations

import asyncio
import http.client
import ssl
import time
import urllib.error

import msgpack

from protocol.pull import PullResponse
from protocol.remoting import RequestCode, ResponseCode
from tests.chaos.scenario import Scenario
from tests.chaos.toxi import Link
from tests.chaos.workload import TOPIC
from tests.support.broker_client import FrameClient, client_session

__all__ = ["FaultNotApplied", "cut_acted", "delay_seen", "match_frozen", "read_served", "reset_seen",
           "stepped_down", "toxic_on"]

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


def cut_acted(s: Scenario, leader: str, follower: str, *, own_log_frozen: bool,
              timeout: float = 20.0) -> None:
    """A cut between ``leader`` and ``follower`` (one way or both) acts: the follower's match
    index freezes on the leader (``match_frozen``) -- or the leader no longer leads (then
    the cut deposed it: also an effect)."""
    if (s.brokers.status(leader) or {}).get("role") != "leader":
        _confirmed(s, f"{leader} no longer leads after the cut between it and {follower}")
        return
    match_frozen(s, leader, follower, own_log_frozen=own_log_frozen, timeout=timeout)


def toxic_on(s: Scenario, link: Link, kind: str, stream: str) -> None:
    """Toxiproxy holds a ``kind`` toxic on ``stream`` of ``link``. For a fault with no
    effect to observe (a link between two followers carries nothing until an election):
    at least it is on the link it names, not another one."""
    held = [t for t in link.toxics() if t.get("type") == kind and t.get("stream") == stream]
    if not held:
        raise FaultNotApplied(f"fault not applied: no {kind} toxic on {stream} of {link.name} "
                              f"(it holds {[(t.get('type'), t.get('stream')) for t in link.toxics()]})")
    _confirmed(s, f"{kind} toxic on {stream} of {link.name} (between followers: nothing to observe)")


def read_served(s: Scenario, leader: str, follower: str, link: Link, timeout: float = 15.0) -> None:
    """A read through ``link`` (``follower``'s client link) is served by the cut ``follower``:
    once the leader's queue 0 ends past the follower's (both read directly), a pull of its
    first message through the link is answered SUCCESS with a message and the queue's end
    as the follower holds it (its log frozen) -- a healthy replica would say a later end."""
    b = s.brokers
    held = _pull_first(s, b.nodes[follower].http)[2]
    deadline = time.monotonic() + timeout
    while (ahead := _pull_first(s, b.nodes[leader].http)[2]) <= held:
        if time.monotonic() >= deadline:
            raise FaultNotApplied(f"fault not applied: {leader}'s queue 0 ends at {ahead}, not past the cut "
                                  f"{follower}'s {held}, {timeout:g}s after the cut")
        time.sleep(0.1)
    code, rows, end = _pull_first(s, link.listen)
    if code != ResponseCode.SUCCESS or rows == 0:
        raise FaultNotApplied(f"fault not applied: a pull through {link.name} was answered "
                              f"{ResponseCode(code).name} with {rows} messages, not served")
    if end != held:
        raise FaultNotApplied(f"fault not applied: the pull through {link.name} was served by a replica "
                              f"whose queue 0 ends at {end}, not by the cut {follower} (at {held}; "
                              f"{leader} at {ahead})")
    _confirmed(s, f"a pull through {link.name} was served by {follower} (queue 0 ends at {held} there, "
                  f"{ahead} on {leader})")


def _pull_first(s: Scenario, address: str) -> tuple[int, int, int]:
    """(code, messages, the queue's end on that replica) of a pull of one message at offset
    0 of queue 0 of ``TOPIC`` at ``address`` (as the super user when ACLs are on)."""
    return asyncio.run(_pull_first_async(s, address))


async def _pull_first_async(s: Scenario, address: str) -> tuple[int, int, int]:
    tls = s.brokers.group.client_tls
    async with client_session(tls) as session:
        client = await FrameClient.connect(session, address, tls=tls is not None)
        try:
            credentials = s.brokers.credentials
            if credentials is not None:
                await client.login(credentials.user, credentials.password)
            frame = await client.call(RequestCode.PULL_MESSAGE, {
                "topic": TOPIC, "queueId": 0, "offset": 0, "maxMsgs": 1}, timeout=10)
        finally:
            await client.close()
    if frame.code != ResponseCode.SUCCESS:
        return frame.code, 0, -1
    answer = PullResponse.from_frame(frame)
    return frame.code, len(msgpack.unpackb(frame.body)) if frame.body else 0, int(answer.max_offset or 0)


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
