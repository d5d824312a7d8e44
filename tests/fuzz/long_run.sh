#!/usr/bin/env bash
# tests/fuzz/long_run.sh — the long fuzz runs of the hardening issue: each
# target for SECONDS_PER_TARGET of wall time (default 1200: 20 CPU-minutes
# when it has a core to itself), one after another at low priority (nice 10),
# its CPU time and final libFuzzer line (executions, coverage, corpus)
# appended to build/fuzz-long/results.txt. Resumable: a target
# already in the results file is skipped, so a run cut short (a session's
# end) continues with the next target when started again. A crash stops the
# run with libFuzzer's report in build/fuzz-long/<target>.log and the input in
# build/fuzz-long/.
#
#   tests/fuzz/long_run.sh [target ...]      # default: every target
#   SECONDS_PER_TARGET=60 tests/fuzz/long_run.sh http
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS=${SECONDS_PER_TARGET:-1200}
OUT=build/fuzz-long
mkdir -p "$OUT"
touch "$OUT/results.txt"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(state http proto adapter gguf tokenizer chat)
make -s $(printf 'build/fuzz/fuzz_%s ' "${targets[@]}") build/fixtures/tiny.gguf
for t in "${targets[@]}"; do
  if grep -q "^$t " "$OUT/results.txt"; then
    echo "long_run: $t already done: $(grep "^$t " "$OUT/results.txt")"
    continue
  fi
  echo "long_run: $t for $SECS s ($(date -u +%H:%M:%S))"
  mkdir -p "build/fuzz-corpus/$t"
  start=$(date +%s)
  if ! (cd "$OUT" && ASAN_OPTIONS=malloc_context_size=0 \
        DARKSERVE_TINY_MODEL="$PWD/../fixtures/tiny.gguf" \
        nice -n 10 /usr/bin/time -f "%U %S" -o "$t.cpu" "../fuzz/fuzz_$t" -max_total_time="$SECS" -max_len=65536 -print_final_stats=1 \
        "../fuzz-corpus/$t" "../../tests/fuzz/corpus/$t" > "$t.log" 2>&1); then
    echo "long_run: $t FAILED, see $OUT/$t.log"
    exit 1
  fi
  wall=$(( $(date +%s) - start ))
  cpu=$(awk '{printf "%.0f", $1 + $2}' "$OUT/$t.cpu")
  last=$(grep -E '^#[0-9]+' "$OUT/$t.log" | tail -1)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$OUT/$t.log" | tail -1)
  echo "$t wall=${wall}s cpu=${cpu}s executions=$execs final: $last" >> "$OUT/results.txt"
  echo "long_run: $t done, ${wall}s wall, ${cpu}s CPU: $last"
done
cat "$OUT/results.txt"
