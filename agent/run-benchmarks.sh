#!/usr/bin/env bash
# Agent overhead benchmark (JMH): the same read loops in JVMs without and with the agent.
#   bash agent/run-benchmarks.sh [forks] [warmup iterations] [measurement iterations]
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="${UNSTALL_CACHE:-$HOME/.cache/unstall}/m2"
mvn -B -q -Dmaven.repo.local="$REPO" -f agent/pom.xml -Pbenchmarks package -DskipTests
cd agent
java -cp "target/test-classes:$(cat target/bench.classpath)" io.unstall.agent.bench.AgentOverhead \
  target/unstall-agent.jar "${1:-2}" "${2:-3}" "${3:-5}"
