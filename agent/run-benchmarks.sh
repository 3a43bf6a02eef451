#!/usr/bin/env bash
# Agent overhead benchmark (JMH): the same read loops in JVMs without and with the agent, in interleaved forks.
#   bash agent/run-benchmarks.sh [rounds] [warmup iterations] [measurement iterations] [benchmark ...]
#   bash agent/run-benchmarks.sh --bundle      # builds, then agent/target/bench-jre (jlink) + bench-lib: what a
#                                             # machine without Java or Maven needs (about 52 MB with the agent jar)
#   UNSTALL_BENCH_PORTABLE=1 bash agent/run-benchmarks.sh ...   # runs from that bundle, without Maven
# Prints the load average before and after (the table is only as good as the machine was quiet).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="${UNSTALL_CACHE:-$HOME/.cache/unstall}/m2"
if [[ "${UNSTALL_BENCH_PORTABLE:-}" == 1 ]]; then
  cd agent
  JAVA=target/bench-jre/bin/java
  CP="target/test-classes:target/bench-lib/*"
else
  mvn -B -q -Dmaven.repo.local="$REPO" -f agent/pom.xml -Pbenchmarks package -DskipTests
  cd agent
  JAVA=java
  CP="target/test-classes:$(cat target/bench.classpath)"
  if [[ "${1:-}" == "--bundle" ]]; then
    rm -rf target/bench-jre target/bench-lib
    mkdir target/bench-lib
    tr ':' '\n' < target/bench.classpath | grep -E '/(jmh-core|jopt-simple|commons-math3)-' | xargs -I{} cp {} target/bench-lib/
    jlink --add-modules java.base,java.instrument,java.logging,java.management,jdk.management,jdk.unsupported,java.xml,java.naming,java.net.http,jdk.attach,java.sql \
      --strip-debug --no-header-files --no-man-pages --compress=2 --output target/bench-jre
    du -sh target/bench-jre target/bench-lib target/unstall-agent.jar target/test-classes
    exit 0
  fi
fi
echo "start: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); $(nproc) cores; $(uptime)"
"$JAVA" -version 2>&1 | head -1
"$JAVA" -cp "$CP" io.unstall.agent.bench.AgentOverhead target/unstall-agent.jar "${1:-5}" "${2:-3}" "${3:-5}" "${@:4}"
echo "end: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); $(uptime)"
