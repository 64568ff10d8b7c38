# Captures the golden conversations of tests/compat/golden/captured from the REAL Apache
# RocketMQ 4.9.7 name server and broker (scripts/reference-rocketmq start), with the
# recording proxy between them and the stock Java client / mqadmin. A developer's tool:
#
#   scripts/reference-rocketmq start
#   .venv/bin/python -m tests.compat.capture_reference [--only NAME ...]
#   scripts/reference-rocketmq stop
#
# Each capture is one conversation written to captured/NAME.hex (format in
# recording_proxy.py and captured/README.md); the harness's JSON events go beside it as
# NAME.events.jsonl (mqadmin's answer as NAME.stdout.txt) so a reader can tell which frame
# carried which message.
from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from tests.compat.harness import JavaRun, mqadmin, run_scenario
from tests.compat.recording_proxy import Recorder, RecordingProxy, Route

CAPTURED = Path(__file__).resolve().parent / "golden" / "captured"
# the Go client's JSON headers (its own field order) do not re-encode byte for byte as
# fastjson's: kept apart from the Java ones, which RaftMQ's codec tests re-encode
CAPTURED_GO = CAPTURED.parent / "captured-go"
REF_NAMESRV, REF_BROKER = 19876, 20911
PROXY_NAMESRV, PROXY_BROKER = 29876, 20921
NAMESRV = f"127.0.0.1:{PROXY_NAMESRV}"
RUN = "cap"  # fixed run id: topic and group names in the captures are stable
TOPIC = "compat-golden"

Capture = Callable[[Path], JavaRun]


def _scenario(name: str, flags: list[str] | None = None, **opts: object) -> Capture:
    return lambda logs: run_scenario(
        name, NAMESRV, log_dir=logs, timeout_s=90, extra_flags=flags, run=RUN, createTopic="true", **opts
    )


def _go(name: str, topic: str, **opts: object) -> Capture:
    """The Go harness; its topic is made first on the reference directly (not recorded)."""

    def run(logs: Path) -> JavaRun:
        made = mqadmin(["updateTopic", "-c", "ReferenceCluster", "-t", topic, "-r", "4", "-w", "4"],
                       f"127.0.0.1:{REF_NAMESRV}", log_dir=logs / "setup")
        assert made.rc == 0, made.tail()
        return run_scenario(name, NAMESRV, log_dir=logs, timeout_s=90, client="go", run=RUN + "go",
                            topic=topic, **opts)

    return run


def _admin(*command: str) -> Capture:
    return lambda logs: mqadmin(list(command), NAMESRV, log_dir=logs)


# name -> what runs through the proxy. produce/consume share one topic: consume reads
# what produce sent (4 = 2 sync + a batch of 2).
CAPTURES: dict[str, Capture] = {
    "producer_send_and_batch": _scenario("produce", topic=TOPIC, count=2),
    "producer_send_rocketmq_serialization": _scenario(
        "produce", ["-Drocketmq.serialize.type=ROCKETMQ"], topic=TOPIC + "-bin", count=2
    ),
    "push_consumer_pull_and_commit": _scenario("consume", topic=TOPIC, group="cg-golden", count=4),
    "ordered_selector_and_orderly_consumer": _scenario("ordered", count=2, keys=2),
    "tags_filter": _scenario("tags", count=1),
    "sql92_filter": _scenario("sql", count=1),
    "broadcast_consumers": _scenario("broadcast", count=2),
    "delay_level_3": _scenario("delay", count=1),
    "retry_then_dlq": _scenario("retry-dlq", count=1, maxReconsumeTimes=1),
    "transaction_commit_rollback_check": _scenario("transaction", count=1),
    "lite_pull_consumer": _scenario("litepull", count=2),
    "go_sends_and_push_consumer": _go("sends", TOPIC + "-go", count=2),
    "go_ordered_sharding_key": _go("ordered", TOPIC + "-go-ordered", count=2, keys=2),
    "go_transaction_check": _go("transaction", TOPIC + "-go-tx", count=1),
    "mqadmin_clusterList": _admin("clusterList"),
    "mqadmin_topicList": _admin("topicList"),
    "mqadmin_topicRoute": _admin("topicRoute", "-t", TOPIC),
    "mqadmin_topicStatus": _admin("topicStatus", "-t", TOPIC),
    "mqadmin_updateTopic": _admin(
        "updateTopic", "-c", "ReferenceCluster", "-t", "compat-admin-made", "-r", "2", "-w", "2"
    ),
    "mqadmin_consumerProgress": _admin("consumerProgress", "-g", "cg-golden"),
    "mqadmin_queryMsgByKey": _admin("queryMsgByKey", "-t", TOPIC, "-k", "sync-0"),
}


def capture(name: str, logs: Path) -> JavaRun:
    folder = CAPTURED_GO if name.startswith("go_") else CAPTURED
    folder.mkdir(parents=True, exist_ok=True)
    out_path = folder / f"{name}.hex"
    with out_path.open("w") as out:
        out.write(f"# {name}: see README.md (tests/compat/capture_reference.py)\n")
        recorder = Recorder(out)
        proxy = RecordingProxy(
            [
                Route("ns", PROXY_NAMESRV, "127.0.0.1", REF_NAMESRV),
                Route("broker", PROXY_BROKER, "127.0.0.1", REF_BROKER),
            ],
            recorder,
            {f"127.0.0.1:{REF_BROKER}".encode(): f"127.0.0.1:{PROXY_BROKER}".encode()},
        ).start()
        try:
            run = CAPTURES[name](logs)
        finally:
            proxy.stop()
    if name.startswith("mqadmin_"):
        (folder / f"{name}.stdout.txt").write_text(run.stdout)
    else:
        (folder / f"{name}.events.jsonl").write_text(
            "".join(line + "\n" for line in run.stdout.splitlines() if line.startswith("{"))
        )
    print(f"{name}: rc={run.rc}, {recorder.frames} frames", file=sys.stderr)
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description="capture golden frames from the reference RocketMQ")
    ap.add_argument("--only", action="append", choices=sorted(CAPTURES))
    args = ap.parse_args()
    CAPTURED.mkdir(parents=True, exist_ok=True)
    failed = []
    with tempfile.TemporaryDirectory(prefix="raftmq-capture-") as tmp:
        for name in args.only or list(CAPTURES):
            run = capture(name, Path(tmp) / name)
            if run.rc != 0:
                failed.append(name)
                print(run.tail(), file=sys.stderr)
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
