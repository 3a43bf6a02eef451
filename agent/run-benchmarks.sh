#!/usr/bin/env bash
# Agent overhead benchmark (JMH): the same read loops in JVMs without and with the agent, in interleaved forks,
# then the agent's bookkeeping per read call alone (BridgeBenchmark) against the CPU time of a read.
#   bash agent/run-benchmarks.sh [rounds] [warmup iterations] [measurement iterations] [benchmark ...]
# Runs from a copy of the built classes and jar, so a rebuild meanwhile does not disturb it. Prints the load
# average before and after: the tables are only as good as the machine was quiet.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="${UNSTALL_CACHE:-$HOME/.cache/unstall}/m2"
mvn -B -q -Dmaven.repo.local="$REPO" -f agent/pom.xml -Pbenchmarks package -DskipTests
RUN=$(mktemp -d)
trap 'rm -rf "$RUN"' EXIT
cp -r agent/target/test-classes "$RUN/test-classes"
cp agent/target/unstall-agent.jar "$RUN/"
cd "$RUN"
echo "start: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); $(nproc) cores; $(uptime)"
java -cp "test-classes:unstall-agent.jar:$(cat "$OLDPWD/agent/target/bench.classpath")" \
  io.unstall.agent.bench.AgentOverhead unstall-agent.jar "${1:-5}" "${2:-3}" "${3:-5}" "${@:4}"
echo "end: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); $(uptime)"
