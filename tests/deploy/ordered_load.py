"""Ordered load run on the deploy test's client host, as an application would run it.

    python ordered_load.py PRODUCER_CREDENTIALS CONSUMER_CREDENTIALS STOP_FILE OUT_JSON [--keys K] [--min N]

A normal user (its file: two lines, name and password) sends ``TAG:key:n`` messages on shard keys
``k0..kK-1`` to topic ``orders`` -- one blocking send at a time, each new payload after its
answer, a failed send recorded as of unknown outcome -- until STOP_FILE exists and at least
N were acknowledged; then an orderly push consumer of group ``billing`` (the other user) reads the topic from
its first offset until every acknowledged message was delivered (or 60 s pass). The name
servers and the CA come from the environment (``RAFTMQ_NAMESRV``, ``RAFTMQ_CA_FILE``) as the
docs set them. OUT_JSON gets the history verifier's figures and problems
(tests/support/message_history.py), and the first send errors.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

from client import ConsumeStatus, Credentials, Message, Producer, PushConsumer
from tests.support.message_history import MessageHistory

TOPIC = "orders"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("producer")
    ap.add_argument("consumer")
    ap.add_argument("stop")
    ap.add_argument("out")
    ap.add_argument("--keys", type=int, default=4)
    ap.add_argument("--min", type=int, default=0)
    ap.add_argument("--pause", type=float, default=0.01)
    ap.add_argument("--tag", default=os.urandom(3).hex(), help="prefix of this run's payloads")
    args = ap.parse_args()
    creds = Credentials(*Path(args.producer).read_text().splitlines()[:2])
    history = MessageHistory()
    errors: list[str] = []
    t0 = time.monotonic()
    producer = Producer(group="shipper", credentials=creds, send_timeout=30).start()
    n = 0
    try:
        while history.acked_count < args.min or not Path(args.stop).exists():
            key = f"k{n % args.keys}"
            payload = f"{args.tag}:{key}:{n}".encode()
            n += 1
            try:
                r = producer.send(Message(TOPIC, payload), shard_key=key)
                history.ok(payload, key, str(r.queue), r.queue_offset)
            except Exception as exc:
                history.unknown(payload, key)
                errors.append(f"{time.monotonic() - t0:.1f}s {exc!r}")
            time.sleep(args.pause)
    finally:
        producer.shutdown()
    sent_s = time.monotonic() - t0

    want = {s.payload for s in history.acked()}
    got: set[bytes] = set()
    all_in = threading.Event()

    def listener(msgs: list, ctx: object) -> ConsumeStatus:
        for m in msgs:
            if not m.body.startswith(f"{args.tag}:".encode()):
                continue  # an earlier run's message
            history.delivered(m.body, str(m.queue), m.queue_offset, "billing", m.commit_log_offset)
            got.add(m.body)
        if want <= got:
            all_in.set()
        return ConsumeStatus.SUCCESS

    consumer = PushConsumer(group="billing", topic=TOPIC, orderly=True, from_where="first",
                            credentials=Credentials(*Path(args.consumer).read_text().splitlines()[:2]))
    consumer.register(listener)
    consumer.start()
    try:
        all_in.wait(60)
    finally:
        consumer.shutdown()
    figures, problems = history.analyze()
    Path(args.out).write_text(json.dumps({"figures": figures, "problems": problems, "errors": errors[:20],
                                          "send_errors": len(errors), "sent_s": round(sent_s, 1),
                                          "total_s": round(time.monotonic() - t0, 1)}))


if __name__ == "__main__":
    main()
