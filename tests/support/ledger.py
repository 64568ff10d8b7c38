"""A transaction listener for tests: a local 'database' that decides by the send's argument."""

from __future__ import annotations

from client import LocalTransactionState, Message

__all__ = ["Ledger"]

_DECISIONS = {"commit": LocalTransactionState.COMMIT, "rollback": LocalTransactionState.ROLLBACK}


class Ledger:
    """``send_in_transaction(msg, "commit" | "rollback")`` decides at once; any other
    argument leaves the transaction open (as a crash before deciding would), and the
    broker's check-backs are answered ``check_answer`` and recorded in ``checked``
    (message bodies, in the order asked; called on the client's thread)."""

    def __init__(self, check_answer: LocalTransactionState) -> None:
        self.check_answer = check_answer
        self.checked: list[bytes] = []

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        return _DECISIONS.get(str(arg), LocalTransactionState.UNKNOWN)

    def check_local_transaction(self, message) -> LocalTransactionState:  # type: ignore[no-untyped-def]
        self.checked.append(message.body)
        return self.check_answer
