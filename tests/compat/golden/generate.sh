#!/usr/bin/env bash
# Compiles GoldenFrames.java against the RocketMQ 4.9.7 jars in ~/.m2 (fetched by
# scripts/bootstrap's Maven step) and writes its golden bytes into encoded/. Run it by hand
# after changing GoldenFrames.java; the unit tests read encoded/ (no Java at test time).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
m2="${M2_REPO:-$HOME/.m2/repository}"
jar() { ls "$m2/$1" 2>/dev/null | head -1 || true; }
cp=""
for j in org/apache/rocketmq/rocketmq-remoting/4.9.7/rocketmq-remoting-4.9.7.jar \
         org/apache/rocketmq/rocketmq-common/4.9.7/rocketmq-common-4.9.7.jar \
         org/apache/rocketmq/rocketmq-logging/4.9.7/rocketmq-logging-4.9.7.jar \
         com/alibaba/fastjson/1.2.69_noneautotype/fastjson-1.2.69_noneautotype.jar \
         io/netty/netty-all/4.1.65.Final/netty-all-4.1.65.Final.jar \
         org/apache/commons/commons-lang3/3.4/commons-lang3-3.4.jar; do
  [ -f "$m2/$j" ] || { echo "missing $m2/$j (run scripts/bootstrap)" >&2; exit 2; }
  cp="$cp:$m2/$j"
done
build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
javac -d "$build" -cp "${cp#:}" "$here/GoldenFrames.java"
java -cp "$build$cp" GoldenFrames "$here/encoded"
echo "wrote $(ls "$here/encoded" | wc -l) files to $here/encoded"
