#!/usr/bin/env bash
# Agent overhead benchmark (JMH): the same read loops in JVMs without and with the agent, in interleaved forks.
#   bash agent/run-benchmarks.sh [rounds] [warmup iterations] [measurement iterations] [benchmark ...]
# Prints the load average before and after (the table is only as good as the machine was quiet).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="${UNSTALL_CACHE:-$HOME/.cache/unstall}/m2"
mvn -B -q -Dmaven.repo.local="$REPO" -f agent/pom.xml -Pbenchmarks package -DskipTests
cd agent
echo "start: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); $(uptime)"
java -cp "target/test-classes:$(cat target/bench.classpath)" io.unstall.agent.bench.AgentOverhead \
  target/unstall-agent.jar "${1:-5}" "${2:-3}" "${3:-5}" "${@:4}"
echo "end: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); $(uptime)"
