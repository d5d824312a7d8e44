#!/usr/bin/env bash
# scripts/bench.sh BIN MODEL [generate args]: single-stream speed of one
# darkserve binary on a model, as medians of several runs (the machines are
# shared and noisy: compare medians, and compare builds side by side, never
# single timings). `make bench` ran this until scripts/bench.py, the
# benchmark of record, replaced it; it stays for quick A/B comparisons.
#   one `darkserve generate` run: greedy, --max-tokens 64, prompt = the first
#   1500 bytes of tests/data/heldout.txt (~350 tokens); its own stderr line
#   gives prefill (prompt) and decode (generated) tokens/s
#   RSS      peak resident set of that run (/usr/bin/time)
# Exact attention unless the extra arguments say otherwise (they go to
# generate after --attn exact, so e.g. --attn darkformer or --attn auto wins).
set -euo pipefail
bin=$1 model=$2; shift 2
runs=${BENCH_RUNS:-5}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
dec=() pre=() rss=()
prompt=$(head -c 1500 tests/data/heldout.txt)
for i in $(seq "$runs"); do
  out=$( { /usr/bin/time -f 'maxrss %M' "$bin" generate --model "$model" --temperature 0 \
           --max-tokens 64 --prompt "$prompt" --attn exact "$@" > /dev/null; } 2>&1 )
  pre+=("$(sed -n 's/^prompt: [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tokens\/s).*/\1/p' <<<"$out")")
  dec+=("$(sed -n 's/.*generated: [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tokens\/s).*/\1/p' <<<"$out")")
  rss+=("$(sed -n 's/^maxrss \([0-9]*\)/\1/p' <<<"$out")")
done
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $("$bin" version | tail -1)"
echo "runs: $runs; args: ${*:-(none)}"
echo "decode  tokens/s: median $(printf '%s\n' "${dec[@]}" | median)  (runs: ${dec[*]})"
echo "prefill tokens/s: median $(printf '%s\n' "${pre[@]}" | median)  (runs: ${pre[*]})"
echo "peak RSS (generate): median $(( $(printf '%s\n' "${rss[@]}" | median | cut -d. -f1) / 1024 )) MiB"
