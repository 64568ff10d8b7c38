"""Who counts as a voter: a member's recorded storage identity against the one answering.

Pure decisions (issue 24), used by the vote, the pre-vote, the leader's commit count and
a replica's own candidacy (``dledger.raft.storage_binding`` applies them to messages):

    the member's record       the storage answering     counts (votes, is counted)
    ------------------------  ------------------------  ------------------------------------
    none recorded yet ("")    a founder (f-...)         yes: the group's first storages
    none recorded yet ("")    a joiner (j-...)          no: it is fed the log, then recorded
    S                         S, a founder              yes
    S                         S, a joiner               once the entry recording S is
                                                        committed (a majority of the storages
                                                        counted before it agreed)
    S                         anything else, or none    no: another storage under that name
    none recorded yet ("")    no token at all           yes: a replica of a version before
                                                        storage identities (a rolling upgrade;
                                                        once upgraded it answers as a founder)

Why the record of a joiner counts only once committed: the storage it replaces may have
voted in a term the new one never heard of; counted on append, the record would change
two voters at once (the old storage out, the new one in), and a leader of a lower term
could then commit with it what the old storage's vote had already ruled out. Committed by
the storages counted before it, the record is a single-server change whose majorities
overlap the old ones. A founder's record only names the storage that already counted.
"""

from __future__ import annotations

from dledger.membership import Member
from dledger.raft.storage_identity import is_founder_token

__all__ = ["counts", "self_vote_refusal"]


def counts(record: Member | None, token: str | None, record_committed: bool) -> bool:
    """Whether a replica answering with storage ``token`` counts as the member ``record``
    (the table above); ``token`` None: the answer carried none (an older version);
    ``record_committed``: the entry that recorded its storage is committed (or it is the
    initial set)."""
    if record is None:
        return False
    if token is None:
        return not record.storage
    if not token:
        return False
    if not record.storage:
        return is_founder_token(token)
    if record.storage != token:
        return False
    return is_founder_token(token) or record_committed


def self_vote_refusal(record: Member | None, token: str, record_committed: bool) -> str | None:
    """Why this replica must neither vote, grant a pre-vote nor stand (None: it may):
    its own record against its own storage, by the same rule as ``counts``."""
    if record is None:
        return None  # not a member: NOT_A_MEMBER holds it back already
    if counts(record, token, record_committed):
        return None
    if not record.storage:
        return (f"its storage {token} is new to the group: it catches up from the leader and votes "
                "once the leader has recorded it")
    if record.storage != token:
        return (f"its storage {token} is not the one the group recorded for it ({record.storage}): "
                "it catches up from the leader and votes once the leader has recorded the new one")
    return f"the entry recording its storage {token} is not committed yet"
