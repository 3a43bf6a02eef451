#!/usr/bin/env bash
# Fuzzes the Jazzer @FuzzTest targets (docs/ARCHITECTURE.md, "Fuzzing"), each in its own JVM (Jazzer fuzzes one
# per JVM), for a bounded time or number of executions, and prints one line per target: executions, coverage
# (libFuzzer's cov: edges and ft: features), corpus size, seconds, result.
#
#   scripts/fuzz.sh all --duration 10          # what CI runs (scripts/test.sh): every target for 10 s
#   scripts/fuzz.sh indexAndRead --runs 1000000  # a long run of one target (docs/BENCHMARKS.md)
#   scripts/fuzz.sh --list
#
# A finding (an exception other than the target's documented ones, a failed assertion, an OutOfMemoryError in
# the 512 MiB heap) fails the run. Jazzer writes the input to the target's corpus in the source tree,
# flight-server/src/test/resources/io/unstall/flight/<pkg>/<Class>Inputs/<method>/crash-<sha1>, where plain
# `mvn test` replays it from then on: fix the code, keep the file. The inputs each run found interesting are kept
# in flight-server/target/fuzz-corpus/<method>/ and seed the next run (mvn clean drops them); the logs are in
# flight-server/target/fuzz-logs/.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$ROOT"

declare -A TARGETS=(
  [fetchTicket]=io.unstall.flight.protocol.ProtocolFuzzTest#fetchTicket
  [plan]=io.unstall.flight.protocol.ProtocolFuzzTest#plan
  [prepTicket]=io.unstall.flight.protocol.ProtocolFuzzTest#prepTicket
  [peerTicket]=io.unstall.flight.protocol.ProtocolFuzzTest#peerTicket
  [localRequest]=io.unstall.flight.protocol.ProtocolFuzzTest#localRequest
  [actionBody]=io.unstall.flight.prep.ActionBodiesFuzzTest#actionBody
  [indexAndRead]=io.unstall.flight.format.TfRecordFuzzTest#indexAndRead
  [tarShard]=io.unstall.flight.format.FormatsFuzzTest#tarShard
  [npyFile]=io.unstall.flight.format.FormatsFuzzTest#npyFile
  [csvFile]=io.unstall.flight.format.FormatsFuzzTest#csvFile
)
ORDER=(fetchTicket plan prepTicket peerTicket localRequest actionBody indexAndRead tarShard npyFile csvFile)

usage() {
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  echo "targets: ${ORDER[*]}"
}

which=""
duration=""
runs=0
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --list) printf '%s\n' "${ORDER[@]}"; exit 0 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "fuzz: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) which="$1"; shift ;;
  esac
done
if [ -z "$which" ]; then
  usage >&2
  exit 2
fi
if [ "$which" = all ]; then
  selected=("${ORDER[@]}")
elif [ -n "${TARGETS[$which]:-}" ]; then
  selected=("$which")
else
  echo "fuzz: unknown target '$which'; targets: ${ORDER[*]}" >&2
  exit 2
fi
[[ "$runs" =~ ^[0-9]+$ ]] || { echo "fuzz: --runs takes a number, got '$runs'" >&2; exit 2; }
if [ -z "$duration" ]; then
  duration=$([ "$runs" -gt 0 ] && echo 0 || echo 10) # --runs alone: until that many executions
fi
[[ "$duration" =~ ^[0-9]+$ ]] || { echo "fuzz: --duration takes whole seconds, got '$duration'" >&2; exit 2; }

MODULE=flight-server
"${MVN[@]}" -q -pl "$MODULE" test-compile
mkdir -p "$MODULE/target/fuzz-logs"

summary=()
failed=0
for t in "${selected[@]}"; do
  corpus="$ROOT/$MODULE/target/fuzz-corpus/$t"
  log="$MODULE/target/fuzz-logs/$t.log"
  mkdir -p "$corpus"
  # jazzer.internal.arg.*: libFuzzer's command line (argv0, the corpus directory it grows, flags that override the
  # @FuzzTest's maxDuration: later flags win); the fuzz profile sets JAZZER_FUZZ=1 and the heap.
  args=(-Pfuzz -pl "$MODULE" surefire:test -Dtest="${TARGETS[$t]}"
        -Djazzer.internal.arg.0=fuzz -Djazzer.internal.arg.1="$corpus"
        -Djazzer.internal.arg.2=-max_total_time="$duration")
  if [ "$runs" -gt 0 ]; then
    args+=(-Djazzer.internal.arg.3=-runs="$runs")
  fi
  step "fuzz $t (${TARGETS[$t]}): $([ "$runs" -gt 0 ] && echo "$runs executions")$([ "$runs" -gt 0 ] && [ "$duration" -gt 0 ] && echo ", at most ")$([ "$duration" -gt 0 ] && echo "${duration} s")"
  start=$(date +%s)
  if "${MVN[@]}" "${args[@]}" >"$log" 2>&1; then result=ok; else result=FAILED; failed=1; fi
  secs=$(( $(date +%s) - start ))
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)
  execs=$(sed -nE 's/^Done ([0-9]+) runs in.*/\1/p' "$log" | tail -1)
  cov=$(sed -nE 's/.* cov: ([0-9]+) .*/\1/p' <<<"$done_line")
  ft=$(sed -nE 's/.* ft: ([0-9]+) .*/\1/p' <<<"$done_line")
  corp=$(sed -nE 's/.* corp: ([0-9]+\/[0-9]+[kKmM]?b) .*/\1/p' <<<"$done_line")
  if [ "$result" = FAILED ]; then
    grep -E '== Java Exception|^(Caused by|	at io\.unstall)|crash-|Test unit written|ERROR\]' "$log" | head -20 || true
    echo "fuzz: $t failed; the log is $log"
  fi
  echo "$done_line"
  summary+=("$(printf '%-14s %-56s %10s %6s %6s %12s %6s  %s' "$t" "${TARGETS[$t]}" "${execs:--}" "${cov:--}" \
    "${ft:--}" "${corp:--}" "$secs" "$result")")
done

step "fuzz summary"
printf '%-14s %-56s %10s %6s %6s %12s %6s  %s\n' target test executions cov ft corpus s result
printf '%s\n' "${summary[@]}"
exit "$failed"
