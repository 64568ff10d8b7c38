#!/usr/bin/env bash
# Compiles JavaSendBench.java against the RocketMQ 4.9.7 client jars in ~/.m2 (scripts/bootstrap
# --compat fetches them) and runs it: java_bench.sh NAMESRV TOPIC THREADS SECONDS BODY_BYTES BATCH.
# Prints one JSON line. The JVM gets a bounded heap and is niced; it ends by itself after
# SECONDS + 2 s of warm-up (and is killed by PID at twice that).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
m2="${M2_REPO:-$HOME/.m2/repository}"
cp=""
for j in org/apache/rocketmq/rocketmq-client/4.9.7/rocketmq-client-4.9.7.jar \
         org/apache/rocketmq/rocketmq-common/4.9.7/rocketmq-common-4.9.7.jar \
         org/apache/rocketmq/rocketmq-remoting/4.9.7/rocketmq-remoting-4.9.7.jar \
         org/apache/rocketmq/rocketmq-logging/4.9.7/rocketmq-logging-4.9.7.jar \
         com/alibaba/fastjson/1.2.69_noneautotype/fastjson-1.2.69_noneautotype.jar \
         io/netty/netty-all/4.1.65.Final/netty-all-4.1.65.Final.jar \
         org/apache/commons/commons-lang3/3.4/commons-lang3-3.4.jar; do
  [ -f "$m2/$j" ] || { echo "missing $m2/$j (run scripts/bootstrap --compat)" >&2; exit 2; }
  cp="$cp:$m2/$j"
done
build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
nice -n 19 javac -d "$build" -cp "${cp#:}" "$here/JavaSendBench.java"
nice -n 19 java -Xms64m -Xmx512m -XX:+UseSerialGC -cp "$build$cp" JavaSendBench "$@" &
pid=$!
limit=$(( 2 * ($4 + 2) + 30 ))
( sleep "$limit"; kill -9 "$pid" 2>/dev/null ) &
watchdog=$!
wait "$pid"
kill "$watchdog" 2>/dev/null || true
