"""The chain of fragments being collected: a message too large for one entry, applied when
its last fragment is (rules in ``broker.store.fragments``).

Not replicated state and never in a checkpoint: while a chain is pending the checkpoint
records the entry before its first fragment as applied, so a restart re-applies the chain
from its start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from broker.state.outcome import Kept, Outcome, kept
from broker.store.fragments import parse_fragment

__all__ = ["ChainCollector", "Whole"]


class Whole(NamedTuple):
    """A chain's message, complete: its bytes, CommitLog position and store time."""

    record: bytes
    position: int  # slice 0's first byte
    stamp: int     # fragment 0's entry's store time


@dataclass(slots=True)
class _Chain:
    chain_id: bytes
    total: int
    first_index: int
    position: int
    stamp: int
    next_number: int = 0
    received: int = 0
    parts: list[bytes] = field(default_factory=list)


class ChainCollector:
    """Apply thread only."""

    def __init__(self) -> None:
        self._chain: _Chain | None = None

    @property
    def first_index(self) -> int | None:
        """The entry of the pending chain's first fragment; None if no chain is pending."""
        return None if self._chain is None else self._chain.first_index

    def abandon(self) -> None:
        """Any entry but the chain's next fragment ends a pending chain: nothing of it is stored."""
        self._chain = None

    def add(self, record: bytes, position: int, stamp: int, index: int) -> Whole | Kept:
        """The fragment ``record`` of entry ``index`` (``position``: the record's, ``stamp``:
        the entry's store time): the chain's message once complete, else this entry's result
        (FRAGMENT: more to come; ABANDONED or INVALID: nothing stored)."""
        try:
            fragment = parse_fragment(record)
        except ValueError as e:
            self._chain = None
            return kept(Outcome.INVALID, reason=str(e))
        chain = self._chain
        if fragment.number == 0:
            chain = self._chain = _Chain(fragment.chain_id, fragment.total, index,
                                         position + fragment.offset, stamp)
        elif chain is None or (chain.chain_id, chain.total, chain.next_number) != (
                fragment.chain_id, fragment.total, fragment.number):
            self._chain = None
            return kept(Outcome.ABANDONED, reason=(
                f"fragment {fragment.number} of message {fragment.chain_id.hex()} does not follow "
                "its previous fragment (another entry came between them, e.g. a leader change); "
                "nothing was stored: send the message again"))
        chain.parts.append(fragment.data)
        chain.received += len(fragment.data)
        chain.next_number += 1
        if chain.received < chain.total:
            return kept(Outcome.FRAGMENT, reason=f"{chain.received} of {chain.total} bytes")
        self._chain = None
        if chain.received > chain.total:
            return kept(Outcome.INVALID, reason=(
                f"the fragments of message {chain.chain_id.hex()} hold {chain.received} bytes, "
                f"more than its {chain.total}"))
        return Whole(b"".join(chain.parts), chain.position, chain.stamp)
