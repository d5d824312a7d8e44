#!/usr/bin/env bash
# make bench: single-stream speed of darkserve on a model, as medians of
# several runs (the machines are shared and noisy: compare medians, and
# compare builds side by side, never single timings).
#   decode   `darkserve generate` greedy, --max-tokens 64, tokens/s of generation
#   prefill  `darkserve perplexity` over tests/data/heldout.txt, batches of 512
#   RSS      peak resident set of the generate run (/usr/bin/time)
# Extra arguments (e.g. --attn performer --features 128) go to both commands.
set -euo pipefail
bin=$1 model=$2; shift 2
runs=${BENCH_RUNS:-5}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
dec=() pre=() rss=()
for i in $(seq "$runs"); do
  out=$( { /usr/bin/time -f 'maxrss %M' "$bin" generate --model "$model" --temperature 0 \
           --max-tokens 64 --prompt "Once upon a time, in a small village by the sea," "$@" \
           > /dev/null; } 2>&1 )
  dec+=("$(sed -n 's/.*generated: [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tokens\/s).*/\1/p' <<<"$out")")
  rss+=("$(sed -n 's/^maxrss \([0-9]*\)/\1/p' <<<"$out")")
  out=$("$bin" perplexity --model "$model" --file tests/data/heldout.txt --chunk 512 --batch 512 \
        --limit 1024 "$@" 2>&1)
  pre+=("$(grep -o '[0-9.]* tokens/s' <<<"$out" | tail -1 | cut -d' ' -f1)")
done
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $("$bin" version | tail -1)"
echo "runs: $runs; args: ${*:-(none)}"
echo "decode  tokens/s: median $(printf '%s\n' "${dec[@]}" | median)  (runs: ${dec[*]})"
echo "prefill tokens/s: median $(printf '%s\n' "${pre[@]}" | median)  (runs: ${pre[*]})"
echo "peak RSS (generate): median $(( $(printf '%s\n' "${rss[@]}" | median | cut -d. -f1) / 1024 )) MiB"
