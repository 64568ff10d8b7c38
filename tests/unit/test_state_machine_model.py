"""The broker's apply step against a model (hypothesis ``RuleBasedStateMachine``): random
topic creates and deletes, sends and resends of idempotent producers, plain sends, offset
commits, checkpoints, and crashes replayed from the checkpoint. After every step the
replica's queues, committed offsets and answers must be the model's:

* a queue's offsets are 0, 1, 2, ... in the order messages were applied (no gap, no reorder);
* a resend of a stored sequence is answered DUPLICATE with its original offset, never stored;
* a sequence after a gap is refused; a message to a missing topic is refused;
* deleting a topic deletes its queues, its consumer offsets and its producers' windows
  (guarantee 6): recreated, it starts empty and a producer starts again at sequence 0;
* users and policy statements are what was put, granted and revoked; deleting a user
  deletes its statements; a grant to a missing user is refused (issue 15);
* a crash after any step, replayed from the last checkpoint, gives the same state.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.state.machine import Applied, BrokerStateMachine, Outcome
from broker.store.commands import (
    CommitOffset,
    CreateTopic,
    DeleteTopic,
    DeleteUser,
    Grant,
    PutUser,
    Revoke,
    encode_admin,
)
from tests.support.ram_dir import RAM_DIR
from tests.unit.test_state_machine import Log, msg

TOPICS = ["orders", "audit"]
PRODUCERS = [None, "p1", "p2"]
GROUPS = ["g1", "g2"]
USERS = ["alice", "bob"]
RESOURCES = ["topic:orders", "topic:*", "group:g1"]
ACTIONS = ["pub", "sub", "get"]


class ApplyStepModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="sm-model-", dir=RAM_DIR))
        self.log = Log()
        self.sm = self._open()
        self.sm.checkpoint()
        self.saved = (self.root / "s" / "state.checkpoint").read_bytes()  # the last checkpoint
        self.n = 0  # message ids
        self.queues: dict[str, list[list[int]]] = {}  # topic -> per queue: message ids in offset order
        self.offsets: dict[tuple[str, str, int], int] = {}  # (group, topic, queue) -> committed
        self.last_seq: dict[tuple[str, str, int], int] = {}  # (producer, topic, queue) -> last stored
        self.offset_of: dict[tuple[str, str, int, int], int] = {}  # (producer, topic, queue, seq)
        self.users: dict[str, bytes] = {}  # user -> stored key
        self.statements: dict[tuple[str, str, str], set[str]] = {}  # (user, resource, decision) -> actions

    def _open(self) -> BrokerStateMachine:
        return BrokerStateMachine(self.root / "s", cq_units_per_file=4, index_slots=8, index_entries=32)

    def _apply(self, record: bytes) -> Applied:
        entry = self.log.add([record])
        self.sm.apply([entry])
        results = self.sm.results(entry.index)
        assert results is not None and len(results) == 1
        return results[0]

    # -- rules ---------------------------------------------------------------------
    @rule(topic=st.sampled_from(TOPICS), queues=st.integers(1, 3))
    def create(self, topic: str, queues: int) -> None:
        if topic in self.queues:
            return  # changing a topic's queue count is another story
        assert self._apply(encode_admin(CreateTopic(topic, queues))).outcome == Outcome.DONE
        self.queues[topic] = [[] for _ in range(queues)]

    @rule(topic=st.sampled_from(TOPICS))
    def delete(self, topic: str) -> None:
        applied = self._apply(encode_admin(DeleteTopic(topic)))
        if topic not in self.queues:
            assert applied.outcome == Outcome.TOPIC_NOT_EXIST
            return
        assert applied.outcome == Outcome.DONE
        del self.queues[topic]
        for model in (self.offsets, self.last_seq):
            for key in [k for k in model if k[1] == topic]:
                del model[key]
        for key in [k for k in self.offset_of if k[1] == topic]:
            del self.offset_of[key]

    @rule(topic=st.sampled_from(TOPICS), queue=st.integers(0, 2), producer=st.sampled_from(PRODUCERS),
          how=st.sampled_from(["next", "resend", "gap"]))
    def send(self, topic: str, queue: int, producer: str | None, how: str) -> None:
        self.n += 1
        qid = queue % len(self.queues[topic]) if topic in self.queues else queue
        key = (producer or "", topic, qid)
        last = self.last_seq.get(key, -1)
        seq = None
        if producer is not None:
            seq = {"next": last + 1, "resend": max(last, 0), "gap": last + 2}[how]
        applied = self._apply(msg(topic, self.n, queue=qid, producer_id=producer, sequence=seq))
        if topic not in self.queues:
            assert applied.outcome == Outcome.TOPIC_NOT_EXIST, applied
            return
        stored = self.queues[topic][qid]
        if producer is not None and seq is not None and seq <= last:
            assert applied.outcome == Outcome.DUPLICATE, applied
            assert applied.queue_offset == self.offset_of[(producer, topic, qid, seq)], applied
            return
        if producer is not None and seq is not None and seq > last + 1:
            assert applied.outcome == Outcome.SEQUENCE_GAP, applied
            return
        assert applied.outcome == Outcome.STORED, applied
        assert applied.queue_offset == len(stored), (applied, len(stored))
        stored.append(self.n)
        if producer is not None and seq is not None:
            self.last_seq[key] = seq
            self.offset_of[(producer, topic, qid, seq)] = applied.queue_offset

    @rule(group=st.sampled_from(GROUPS), topic=st.sampled_from(TOPICS), queue=st.integers(0, 2),
          offset=st.integers(0, 20))
    def commit(self, group: str, topic: str, queue: int, offset: int) -> None:
        applied = self._apply(encode_admin(CommitOffset(group, topic, queue, offset)))
        if topic not in self.queues:
            assert applied.outcome == Outcome.TOPIC_NOT_EXIST
            return
        assert applied.outcome == Outcome.DONE
        self.offsets[(group, topic, queue)] = offset

    @rule(user=st.sampled_from(USERS), key=st.binary(min_size=32, max_size=32))
    def put_user(self, user: str, key: bytes) -> None:
        applied = self._apply(encode_admin(PutUser(user, False, b"s" * 16, 4096, key, key)))
        assert applied.outcome == Outcome.DONE
        self.users[user] = key

    @rule(user=st.sampled_from(USERS))
    def delete_user(self, user: str) -> None:
        applied = self._apply(encode_admin(DeleteUser(user)))
        assert applied.outcome == (Outcome.DONE if user in self.users else Outcome.INVALID)
        self.users.pop(user, None)
        self.statements = {k: a for k, a in self.statements.items() if k[0] != user}

    @rule(user=st.sampled_from(USERS), resource=st.sampled_from(RESOURCES), deny=st.booleans(),
          actions=st.sets(st.sampled_from(ACTIONS)), revoke=st.booleans())
    def grant_or_revoke(self, user: str, resource: str, deny: bool, actions: set[str], revoke: bool) -> None:
        key = (user, resource, "deny" if deny else "allow")
        kind = Revoke if revoke else Grant
        applied = self._apply(encode_admin(kind(user, resource, key[2], "", tuple(sorted(actions)))))
        if revoke:
            if key not in self.statements:
                assert applied.outcome == Outcome.INVALID
                return
            held = self.statements.pop(key)
            left = held - actions if actions else set()  # no actions: revoke every one
            if left:
                self.statements[key] = left
        else:
            if user not in self.users or not actions:  # a grant of nothing is refused
                assert applied.outcome == Outcome.INVALID
                return
            self.statements[key] = self.statements.get(key, set()) | actions
        assert applied.outcome == Outcome.DONE

    @rule()
    def checkpoint(self) -> None:
        """The apply step may write one at any time."""
        self.sm.checkpoint()
        self.saved = (self.root / "s" / "state.checkpoint").read_bytes()

    @precondition(lambda self: len(self.log.entries) > 0)
    @rule()
    def crash_and_replay(self) -> None:
        """A crash after the last checkpoint: the queues hold more than it says; reopen and
        replay the log after it."""
        self.sm.close()
        (self.root / "s" / "state.checkpoint").write_bytes(self.saved)
        self.sm = self._open()
        self.sm.apply([e for e in self.log.entries if e.index > self.sm.applied_index()])

    # -- what must hold after every step ------------------------------------------------
    @invariant()
    def queues_and_offsets_are_the_models(self) -> None:
        assert set(self.sm.topics) == set(self.queues)
        for topic, queues in self.queues.items():
            for qid, stored in enumerate(queues):
                cq = self.sm.queue(topic, qid)
                assert (cq.max_offset if cq is not None else 0) == len(stored), (topic, qid)
        for group in GROUPS:
            for topic in TOPICS:
                for qid in range(3):
                    want = self.offsets.get((group, topic, qid))
                    assert self.sm.committed_offset(group, topic, qid) == want, (group, topic, qid)

    @invariant()
    def users_and_statements_are_the_models(self) -> None:
        access = self.sm.access
        assert {u: c.stored_key for u, c in access.users.items()} == self.users
        assert {(s.user, s.resource, s.decision): set(s.actions) for s in access.statements()} == \
            {k: a for k, a in self.statements.items()}

    def teardown(self) -> None:
        self.sm.close()
        shutil.rmtree(self.root, ignore_errors=True)


ApplyStepModel.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
test_the_apply_step_behaves_as_its_model = ApplyStepModel.TestCase
