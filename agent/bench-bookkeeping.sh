#!/usr/bin/env bash
# The agent's bookkeeping per read call (BridgeBenchmark: readEnter + readExit of a 4 KiB read, no system call),
# this checkout against the bootstrap package of REV, in interleaved forks (order alternating per round).
#   bash agent/bench-bookkeeping.sh [rounds=6] [rev=main]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-6}"
REV="${2:-main}"
REPO="${UNSTALL_CACHE:-$HOME/.cache/unstall}/m2"
mvn -B -q -Dmaven.repo.local="$REPO" -f agent/pom.xml -Pbenchmarks package -DskipTests
RUN=$(mktemp -d)
trap 'rm -rf "$RUN"' EXIT
git archive "$REV" agent/src/main/java/io/unstall/agent/bootstrap | tar -x -C "$RUN"
mkdir "$RUN/old"
javac -d "$RUN/old" $(find "$RUN/agent" -name '*.java')
cp -r agent/target/test-classes "$RUN/test-classes"
cp agent/target/unstall-agent.jar "$RUN/"
LIBS="$(cat agent/target/bench.classpath)"
cd "$RUN"
echo "start: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); $(nproc) cores; $(uptime)"
for r in $(seq "$ROUNDS"); do
  sides="old new"; (( r % 2 == 0 )) && sides="new old"
  for side in $sides; do
    if [[ $side == old ]]; then cp="old:test-classes:$LIBS"; else cp="test-classes:unstall-agent.jar:$LIBS"; fi
    java -cp "$cp" org.openjdk.jmh.Main 'BridgeBenchmark.trackedRead$' -f 1 -wi 3 -i 5 -w 1 -r 1 \
      -rf csv -rff "$side-$r.csv" > /dev/null
    echo "round $r $side: $(awk -F, 'NR==2{gsub(/"/,"",$5); print $5}' "$side-$r.csv") ns per read"
  done
done | tee rounds.txt
python3 - "$REV" <<'PY'
import re, statistics, sys
t975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228]
v = {"old": [], "new": []}
for line in open("rounds.txt"):
    m = re.match(r"round \d+ (old|new): ([0-9.]+)", line)
    v[m.group(1)].append(float(m.group(2)))
def ci(x):
    return t975[min(len(x) - 1, len(t975)) - 1] * statistics.stdev(x) / len(x) ** 0.5
print(f"\n| bootstrap package | ns per tracked read (mean ± 95% CI over {len(v['new'])} forks) |\n|---|---|")
print(f"| {sys.argv[1]} | {statistics.mean(v['old']):.1f} ± {ci(v['old']):.1f} |")
print(f"| this checkout | {statistics.mean(v['new']):.1f} ± {ci(v['new']):.1f} |")
PY
echo "end: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); $(uptime)"
