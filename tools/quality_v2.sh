#!/usr/bin/env bash
# tools/quality_v2.sh — the measurements of docs/QUALITY.md "DARKFormer v2":
# perplexity of one configuration at 1K chunks on both short held-out texts
# and as one 65,536-token stream on both long ones, each token's NLL kept in
# OUT/<name>.<text>.f32 for tools/ppl_buckets.py (which compares runs on the
# same tokens, bucketed by position in the stream).
#
#   tools/quality_v2.sh NAME [darkserve perplexity flags...]
#   tools/quality_v2.sh control --attn exact      # the control: exact, 1K chunks everywhere
#
# The control scores the long texts in chunks of 1,024 too (the original
# model with a 1K context), every other configuration as one stream.
# Env: OUT (default build/quality), BIN (default build/darkserve),
# TEXTS (default "h1 h2 kjv gnu"), THREADS (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1
shift
OUT=${OUT:-build/quality}
BIN=${BIN:-build/darkserve}
THREADS=${THREADS:-1}
mkdir -p "$OUT"
declare -A file=([h1]=tests/data/heldout.txt [h2]=tests/data/heldout2.txt
                 [kjv]=tests/data/long/kjv_genesis_exodus.txt
                 [gnu]=tests/data/long/gnu_standards.txt)
for t in ${TEXTS:-h1 h2 kjv gnu}; do
  chunk=1024
  limit=()
  case $t in
    kjv|gnu) limit=(--limit 65536); [ "$name" = control ] || chunk=0 ;;
  esac
  start=$(date +%s)
  res=$("$BIN" perplexity --file "${file[$t]}" --chunk "$chunk" "${limit[@]}" \
          --threads "$THREADS" --nll-out "$OUT/$name.$t.f32" "$@" 2>"$OUT/$name.$t.log" | tail -1)
  echo "$name $t: $res ($(( $(date +%s) - start )) s)"
done
