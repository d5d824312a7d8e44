#!/usr/bin/env bash
# tools/batch_ablation.sh — what the 16-row decode step would take if one
# part of it cost nothing (the 16-stream batching target; docs/PERFORMANCE.md
# "The 16-stream batching target: the ceiling on two cores").
#
#   tools/batch_ablation.sh [ROUNDS]
#   tools/batch_ablation.sh --check     only apply the patches (to copies of
#                                       the three files) and say whether they fit
#
# Copies the tracked files of this tree (as they are in the working tree)
# into a temporary directory once per variant, removes one part of the work
# there, builds bench_decode and runs it at the HTTP benchmark's shape (16 sequences,
# context 48, 64 tokens, default DARKFormer adapter), the variants
# alternating, ROUNDS rounds (default 3). The removed parts give wrong
# tokens: these builds measure time only and are deleted afterwards.
#
#   base       the committed code
#   no-float   the batched kernel's float work (amx_scale and the offsets'
#              pass in core/kernels/qdot_pack.c): its tile work alone
#   no-tiles   its tile work (multiplies and sums' stores): its float work
#   no-window  the window's score and value products (core/kernels/blas.c's half
#              kernels return at once)
#   half-window  those products over half the keys
#
# Prints each variant's median tokens/s over the rounds and the step in ms
# (16 sequences / tokens/s). Needs the model and adapter that `make bench`
# uses (models/); env MODEL, ADAPTER override them.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=measure
case "${1:-}" in
  --check) mode=check ;;
  ''|[1-9]|[1-9][0-9]) ;;
  *) echo "usage: tools/batch_ablation.sh [ROUNDS 1..99] | --check" >&2; exit 2 ;;
esac
ROUNDS=${1:-3}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
ADAPTER=${ADAPTER:-models/adapters/SmolLM2-135M-Instruct.Q4_1.darkformer.gguf}
PY=${PYTHON:-python3}
if [ $mode != check ]; then
  for f in "$MODEL" "$ADAPTER"; do
    [ -f "$f" ] || { echo "batch_ablation: $f missing (make run fetches it)" >&2; exit 1; }
  done
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/batch_ablation.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
variants="base no-float no-tiles no-window half-window"
for v in $variants; do
  mkdir -p "$tmp/$v"
  if [ $mode = check ]; then
    mkdir -p "$tmp/$v/core/kernels" "$tmp/$v/core/attn"
    cp core/kernels/qdot_pack.c core/kernels/blas.c "$tmp/$v/core/kernels/"
    cp core/attn/attn_linear.c "$tmp/$v/core/attn/"
  else
    git ls-files -z | tar --null -T - -cf - | tar -x -C "$tmp/$v"
  fi
  # each patch asserts the code it changes is there, so a changed kernel
  # fails loudly instead of measuring nothing
  "$PY" - "$tmp/$v" "$v" <<'PY'
import sys
root, v = sys.argv[1], sys.argv[2]
def patch(path, pairs):
    p = f"{root}/{path}"
    s = open(p).read()
    for old, new in pairs:
        if s.count(old) < 1:
            sys.exit(f"batch_ablation: {v}: {path} no longer has {old!r}")
        s = s.replace(old, new)
    open(p, "w").write(s)
if v == "no-float":
    patch("core/kernels/qdot_pack.c", [
        ("        for (int64_t q = 0; q < nt; q++)\n            amx_scale(",
         "        for (int64_t q = 0; q < 0; q++)\n            amx_scale("),
        ("    if (type != CORE_TTYPE_Q8_0) {\n        for (int64_t b = 0; b < nb; b++, gp += gb) {",
         "    if (0) {\n        for (int64_t b = 0; b < nb; b++, gp += gb) {")])
elif v == "no-tiles":
    patch("core/kernels/qdot_pack.c", [
        ("        __asm__ volatile(\"\" ::: \"memory\");                                                       \\\n        _tile_zero(C);",
         "        break;                                                                                   \\\n        _tile_zero(C);"),
        ("        _tile_stored(0, cb, 64);\n", "        if (0) _tile_stored(0, cb, 64);\n"),
        ("        if (nt > 1)\n            _tile_stored(1,", "        if (0)\n            _tile_stored(1,"),
        ("        if (nt > 2)\n            _tile_stored(2,", "        if (0)\n            _tile_stored(2,"),
        ("        if (nt > 3)\n            _tile_stored(3,", "        if (0)\n            _tile_stored(3,")])
elif v == "half-window":
    patch("core/kernels/blas.c", [
        ("    if (m > 4 || k % 16 != 0)\n        return 0;\n    NT4_CASES(1, b)",
         "    if (m > 4 || k % 16 != 0)\n        return 0;\n    n /= 2;\n    NT4_CASES(1, b)"),
        ("    if (m > 4 || n % 64 != 0)\n        return 0;\n    for (int64_t j = 0; j < n; j += 64)\n        NN64_CASES(1, b)",
         "    if (m > 4 || n % 64 != 0)\n        return 0;\n    k /= 2;\n    for (int64_t j = 0; j < n; j += 64)\n        NN64_CASES(1, b)")])
elif v == "no-window":
    patch("core/kernels/blas.c", [
        ("    if (m > 4 || k % 16 != 0)\n        return 0;\n    NT4_CASES(1, b)",
         "    if (m > 4 || k % 16 != 0)\n        return 0;\n    return 1;\n    NT4_CASES(1, b)"),
        ("    if (m > 4 || n % 64 != 0)\n        return 0;\n    for (int64_t j = 0; j < n; j += 64)\n        NN64_CASES(1, b)",
         "    if (m > 4 || n % 64 != 0)\n        return 0;\n    return 1;\n    for (int64_t j = 0; j < n; j += 64)\n        NN64_CASES(1, b)")])
PY
  if [ $mode = check ]; then
    if [ "$v" = base ]; then echo "batch_ablation: base: no patch"
    else echo "batch_ablation: $v: the patch fits"; fi
    continue
  fi
  echo "batch_ablation: building $v" >&2
  make -s -C "$tmp/$v" -j2 build/tools/bench_decode WARN= >/dev/null
done
[ $mode = measure ] || exit 0
for r in $(seq 1 "$ROUNDS"); do
  for v in $variants; do
    tps=$(OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX} "$tmp/$v/build/tools/bench_decode" \
            --model "$MODEL" --attn darkformer --adapter "$ADAPTER" --ctx 48 --tokens 64 \
            --runs 3 --batch 16 2>&1 | sed -n 's/.*median \([0-9.]*\).*/\1/p' | tail -1)
    echo "$v $tps" >> "$tmp/results"
    echo "round $r $v: $tps tokens/s" >&2
  done
done
"$PY" - "$tmp/results" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    v, t = line.split()
    runs.setdefault(v, []).append(float(t))
for v, ts in runs.items():
    m = statistics.median(ts)
    print(f"{v:10s} median {m:8.1f} tokens/s  step {16000.0 / m:5.2f} ms  "
          f"(rounds: {', '.join(f'{t:.1f}' for t in ts)})")
PY
