#!/usr/bin/env bash
# tests/fuzz/long_run.sh — the long fuzz runs of the hardening issue: each
# target until the fuzzer has used CPU_SECONDS of CPU time (default 1260: a
# little over 20 CPU-minutes), one after another at low priority (nice 10).
# A target runs in segments of at most the CPU time it still needs (wall
# time, libFuzzer's -max_total_time), each resuming from the corpus the last
# one grew, until the segments' CPU time adds up; progress is kept in
# build/fuzz-long/<target>.progress, and the total (wall, CPU, executions,
# the last segment's final libFuzzer line: coverage, corpus) is appended to
# build/fuzz-long/results.txt. Resumable: a target already in the results
# file with enough CPU time is skipped, one with less continues, so a run cut
# short (a session's end) goes on where it stopped when started again. A
# crash stops the run with libFuzzer's report in build/fuzz-long/<target>.log
# and the input in build/fuzz-long/.
#
#   tests/fuzz/long_run.sh [target ...]      # default: every target
#   CPU_SECONDS=60 tests/fuzz/long_run.sh http
set -euo pipefail
cd "$(dirname "$0")/../.."
CPU_TARGET=${CPU_SECONDS:-1260}
OUT=build/fuzz-long
mkdir -p "$OUT"
touch "$OUT/results.txt"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(state http proto adapter gguf tokenizer chat)
make -s $(printf 'build/fuzz/fuzz_%s ' "${targets[@]}") build/fixtures/tiny.gguf
field() { sed -n "s/.* $1=\([0-9]*\).*/\1/p"; }
for t in "${targets[@]}"; do
  prev=$(grep "^$t " "$OUT/results.txt" || true)
  if [ -n "$prev" ]; then
    if [ "$(echo "$prev" | field cpu)" -ge "$CPU_TARGET" ]; then
      echo "long_run: $t already done: $prev"
      continue
    fi
    # an earlier, shorter run: its totals become this one's starting progress
    [ -f "$OUT/$t.progress" ] ||
      echo "$(echo "$prev" | field wall) $(echo "$prev" | field cpu) $(echo "$prev" | field executions)" \
        > "$OUT/$t.progress"
    grep -v "^$t " "$OUT/results.txt" > "$OUT/results.tmp" || true
    mv "$OUT/results.tmp" "$OUT/results.txt"
  fi
  wall=0 cpu=0 execs=0
  [ ! -f "$OUT/$t.progress" ] || read -r wall cpu execs < "$OUT/$t.progress"
  mkdir -p "build/fuzz-corpus/$t"
  while [ "$cpu" -lt "$CPU_TARGET" ]; do
    secs=$(( CPU_TARGET - cpu < 60 ? 60 : CPU_TARGET - cpu ))
    echo "long_run: $t, ${cpu}s CPU so far, next segment ${secs}s ($(date -u +%H:%M:%S))"
    start=$(date +%s)
    if ! (cd "$OUT" && ASAN_OPTIONS=malloc_context_size=0 \
          DARKSERVE_TINY_MODEL="$PWD/../fixtures/tiny.gguf" \
          nice -n 10 /usr/bin/time -f "%U %S" -o "$t.cpu" "../fuzz/fuzz_$t" -max_total_time="$secs" -max_len=65536 -print_final_stats=1 \
          "../fuzz-corpus/$t" "../../tests/fuzz/corpus/$t" > "$t.log" 2>&1); then
      echo "long_run: $t FAILED, see $OUT/$t.log"
      exit 1
    fi
    wall=$(( wall + $(date +%s) - start ))
    cpu=$(( cpu + $(awk '{printf "%.0f", $1 + $2}' "$OUT/$t.cpu") ))
    execs=$(( execs + $(sed -n 's/^stat::number_of_executed_units: *//p' "$OUT/$t.log" | tail -1) ))
    echo "$wall $cpu $execs" > "$OUT/$t.progress"
  done
  last=$(grep -E '^#[0-9]+' "$OUT/$t.log" | tail -1)
  echo "$t wall=${wall}s cpu=${cpu}s executions=$execs final: $last" >> "$OUT/results.txt"
  rm -f "$OUT/$t.progress"
  echo "long_run: $t done, ${wall}s wall, ${cpu}s CPU, $execs executions: $last"
done
cat "$OUT/results.txt"
