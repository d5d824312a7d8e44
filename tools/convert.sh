#!/usr/bin/env bash
# tools/convert.sh — the DARKFormer conversion pipeline of the default model
# (the lead wires it as `make adapter`). Offline: not part of make test.
#
#   tools/convert.sh [--features M] [--window W] [--steps N] [--init MAT.f32]
#                    [--out ADAPTER.gguf] [--work DIR] [--build DIR]
#   tools/convert.sh --is [--out IS.gguf]      # the DARKFormer-IS adapter (Λ only)
#   tools/convert.sh --v2 [--features M] [--window W] [--sinks S] [--train-sinks S]
#                    [--prerope 0|1]
#                    [--steps N] [--seqs N] [--len T] [--distill-steps N]
#                    [--lora R] [--serve-window W] [--kv-bits 8|16] [--out ADAPTER.gguf]
#                    [--init-scale X] [--lr X] [--lr-small X] [--mass-weight X]
#     (the last four go to convert.py train2: Gemma's adapter needs M to start
#     at 0.1·I with lr 0.001 / 0.01, models/adapters/README.md)
#   tools/convert.sh --v2 --kind flexformer-s|flexformer-n [the options above]
#     (`make adapter KIND=...`) the Flexformer kinds' stage 1 in the same
#     pipeline: frequencies from the Performer draws, the input sphere of
#     radius 1 to start (learned per KV head) and the drop rule for
#     negative denominators (tools/flexfeat.py), decays and mixing weights,
#     then the linear branch gated off per (layer, KV head) where that gives
#     a lower output error on 2 further calibration sequences (convert.py
#     gate); defaults 6 x 1024 recorded tokens, 40 steps a layer, 16 sinks in
#     training, served with the trained window in 16-bit rows; no stage 2
#     (tools/distill.py does not model the sphere); models/adapters/README.md
#     "Flexformer".
#     DARKFormer v2 (`make adapter MODEL=...` runs this): record N sequences
#     of T tokens (default 12 x 2048) of the calibration corpus
#     (models/corpus/calibration.txt.xz, never a held-out text), then
#     stage 1, tools/convert.py train2 (M before RoPE, decays, mixing
#     weights, layer by layer, with --train-sinks sinks, default 4), then
#     optionally stage 2, tools/distill.py (the same parameters end to end
#     against the exact model's next-token distribution on 2 x 1024-token
#     spans a step; --distill-steps N runs N steps, default 0 = none: the
#     default adapter is stage 1, models/adapters/README.md "The default:
#     stage 1 served with a window of 1,024"; with a rank-R update of q, k, v, o,
#     --lora R, default 8, 0 for none) with --sinks sinks (default 16), the
#     validated step with the lowest perplexity on a validation slice of the
#     corpus written as the adapter (the shipped default's recipe,
#     models/adapters/README.md), with the serving defaults it carries
#     (darkformer.serve_window, default 1024, and darkformer.kv_bits,
#     default 8: docs/QUALITY.md "The default window and 8-bit rows"; the
#     selection above runs each step with its trained window). Each stage
#     has a checkpoint under WORK, so an
#     interrupted run resumes where it stopped. Prints how long each stage
#     took.
#
# 1. record: $BUILD/tools/record_qkv runs the exact model over
#    tests/data/calibration.txt (40 sequences x 512 tokens; never the
#    held-out text) and writes q, k (after RoPE), v per layer and the
#    feature draws ε (seed 0, 256 rows) under WORK/cal (reused when present).
# 2. Λ (tools/convert.py lambda) for DARKFormer-IS.
# 3. M (tools/convert.py train): attention transfer for (M, W), 32
#    training + 8 validation sequences, early stopping.
# 4. $BUILD/tools/write_adapter writes the GGUF (docs/ADAPTER.md) and checks
#    that the model loads with it.
# Needs: make BUILD=... $BUILD/tools/record_qkv $BUILD/tools/write_adapter,
# and a Python with tools/requirements-convert.txt (env CONVERT_PY, default
# build/convert-venv/bin/python; create it with
#   python3 -m venv build/convert-venv &&
#   build/convert-venv/bin/pip install -r tools/requirements-convert.txt
# — a separate venv because jax needs numpy >= 2 and .venv pins numpy 1.26).
set -euo pipefail
cd "$(dirname "$0")/.."

M=128 W=64 STEPS=150 INIT="" OUT="" WORK=build/convert BUILD=build IS=0 V2=0
S=16 TRAIN_S=4 PRE=1 SEQS=12 LEN=2048 W_SET=0 DSTEPS=0 LORA=8 SERVE_W=1024 KV_BITS=8 WORK_SET=0
KIND=darkformer SET=" "  # SET: the options given, so that a kind's defaults leave them alone
TRAIN_ARGS=()
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
while [ $# -gt 0 ]; do
  SET="$SET$1 "
  case $1 in
    --kind) KIND=$2; shift 2 ;;
    --features) M=$2; shift 2 ;;
    --window) W=$2; W_SET=1; shift 2 ;;
    --sinks) S=$2; shift 2 ;;
    --train-sinks) TRAIN_S=$2; shift 2 ;;
    --prerope) PRE=$2; shift 2 ;;
    --seqs) SEQS=$2; shift 2 ;;
    --len) LEN=$2; shift 2 ;;
    --v2) V2=1; shift ;;
    --distill-steps) DSTEPS=$2; shift 2 ;;
    --lora) LORA=$2; shift 2 ;;
    --serve-window) SERVE_W=$2; shift 2 ;;
    --kv-bits) KV_BITS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --init-scale|--lr|--lr-small|--mass-weight) TRAIN_ARGS+=("$1" "$2"); shift 2 ;;
    --init) INIT=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --work) WORK=$2; WORK_SET=1; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --is) IS=1; shift ;;
    *) echo "convert.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
PY=${CONVERT_PY:-build/convert-venv/bin/python}
# another model than the default works in a folder of its own (its
# recordings and checkpoints must not be taken for the default's)
if [ "$WORK_SET" = 0 ] && [ "$MODEL" != models/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
  stem=$(basename "$MODEL" .gguf)
  WORK=build/convert-$stem
fi
mkdir -p "$WORK"

given() { case $SET in *" $1 "*) return 0 ;; esac; return 1; }
FLEX=0
case $KIND in
  darkformer) ;;
  flexformer-s|flexformer-n) FLEX=1 ;;
  *) echo "convert.sh: --kind must be darkformer, flexformer-s or flexformer-n" >&2; exit 2 ;;
esac
if [ "$FLEX" = 1 ]; then
  [ "$V2" = 1 ] || { echo "convert.sh: --kind $KIND needs --v2" >&2; exit 2; }
  [ "$DSTEPS" = 0 ] || { echo "convert.sh: no stage 2 for $KIND (tools/distill.py does not model the input sphere)" >&2; exit 2; }
  given --seqs || SEQS=6
  given --len || LEN=1024
  given --steps || STEPS=40
  given --train-sinks || TRAIN_S=16
  given --kv-bits || KV_BITS=16
  TRAIN_ARGS+=(--kind "$KIND" --flex-pre norm --flex-scale0 1 --flex-den drop --val-every 10)
fi

if [ "$V2" = 1 ]; then
  [ "$W_SET" = 1 ] || W=256
  [ "$FLEX" = 1 ] && ! given --serve-window && SERVE_W=$W
  [ "$STEPS" = 150 ] && STEPS=100
  t_all=$(date +%s)
  stage() { echo "convert: $* ($(( $(date +%s) - t_all )) s so far)"; }
  if [ ! -x "$PY" ]; then
    stage "creating the conversion venv build/convert-venv (jax CPU)"
    python3 -m venv build/convert-venv
    build/convert-venv/bin/pip install -q -r tools/requirements-convert.txt
    PY=build/convert-venv/bin/python
  fi
  REC="$WORK/cal_v2_${SEQS}x${LEN}"
  if [ ! -f "$REC/meta.json" ]; then
    [ -f "$WORK/calibration.txt" ] || xz -dc models/corpus/calibration.txt.xz > "$WORK/calibration.txt"
    stage "recording q, k, v of $MODEL over $SEQS x $LEN calibration tokens into $REC"
    "$BUILD/tools/record_qkv" --model "$MODEL" --text "$WORK/calibration.txt" \
      --out "$REC" --seqs "$SEQS" --len "$LEN" --draws "$M" --seed 0
  fi
  TAG="v2_m${M}_w${W}_s${TRAIN_S}_p${PRE}"
  [ "$FLEX" = 1 ] && TAG="${KIND}_m${M}_w${W}_s${TRAIN_S}_p${PRE}"
  stage "training M, decays and mixing weights (checkpoint $WORK/$TAG.npz)"
  "$PY" tools/convert.py train2 --rec "$REC" --features "$M" --window "$W" --sinks "$TRAIN_S" \
    --prerope "$PRE" --steps "$STEPS" --ckpt "$WORK/$TAG.npz" --log "$WORK/$TAG.json" \
    "${TRAIN_ARGS[@]}" --out "$WORK/$TAG"
  OUT=${OUT:-$WORK/$TAG.gguf}
  if [ "$FLEX" = 1 ]; then
    # the linear branch kept per (layer, KV head) only where it beats the
    # branch off on 2 further calibration sequences (tools/convert.py gate)
    SEL="$WORK/sel_v2_2x${LEN}_after${SEQS}"
    if [ ! -f "$SEL/meta.json" ]; then
      stage "recording the selection sequences into $SEL"
      "$BUILD/tools/record_qkv" --model "$MODEL" --text "$WORK/calibration.txt" \
        --out "$SEL" --seqs 2 --len "$LEN" --skip "$SEQS" --draws "$M" --seed 0
    fi
    stage "gating the linear branch per KV head"
    for den in drop off; do
      "$PY" tools/convert.py train2 --eval-only --rec "$SEL" --features "$M" --window "$W" \
        --sinks "$TRAIN_S" --prerope "$PRE" --kind "$KIND" --flex-pre norm --flex-scale0 1 \
        --flex-den "$den" --ckpt "$WORK/$TAG.npz" --log "$WORK/$TAG.sel_$den.json" \
        --out /dev/null > /dev/null
    done
    "$PY" tools/convert.py gate --ckpt "$WORK/$TAG.npz" --trained "$WORK/$TAG.sel_drop.json" \
      --off "$WORK/$TAG.sel_off.json" --out "$WORK/$TAG.gated.npz" --log "$WORK/$TAG.gate.json"
    "$PY" tools/convert.py train2 --rec "$REC" --features "$M" --window "$W" --sinks "$TRAIN_S" \
      --prerope "$PRE" --ckpt "$WORK/$TAG.gated.npz" "${TRAIN_ARGS[@]}" --out "$WORK/$TAG.gated"
    TAG="$TAG.gated"
  fi
  write() {  # PREFIX OUT [LORA-RANK]
    local lora=()
    [ "${3:-0}" != 0 ] && lora=(--lora "$1.lora" --lora-rank "$3")
    local par=(--kind darkformer --mat "$1.mat.f32")
    [ "$FLEX" = 1 ] && par=(--kind "$KIND" --omega "$1.omega.f32" --radius "$1.scale.f32")
    [ "$KIND" = flexformer-n ] && par+=(--omega2 "$1.omega2.f32" --tau "$1.tau.f32")
    "$BUILD/tools/write_adapter" --model "$MODEL" "${par[@]}" --features "$M" --window "$W" \
      --sinks "$S" --prerope "$PRE" --seed 0 --decay "$1.decay.f32" \
      --mix "$1.mix.f32" "${lora[@]}" --out "$2"
  }
  serving() {  # IN OUT: the adapter with its serving defaults
    "$BUILD/tools/write_adapter" --model "$MODEL" --from "$1" --serve-window "$SERVE_W" \
      --kv-bits "$KV_BITS" --out "$2"
  }
  # stage 2 (tools/distill.py) models Llama-family decoders only: a model
  # with sliding-window layers (gemma3) gets stage 1 alone
  if [ "$DSTEPS" != 0 ] && "$BUILD/darkserve" info "$MODEL" 2>/dev/null |
       grep -q '^architecture  *gemma3$'; then
    stage "stage 2 skipped: tools/distill.py does not model $MODEL's architecture (gemma3)"
    DSTEPS=0
  fi
  if [ "$DSTEPS" = 0 ]; then
    write "$WORK/$TAG" "$WORK/$TAG.trained.gguf"
    serving "$WORK/$TAG.trained.gguf" "$OUT"
    stage "done: $OUT"
    exit 0
  fi
  write "$WORK/$TAG" "$WORK/$TAG.stage1.gguf"
  if [ ! -f "$WORK/distill_ids.npy" ] || [ ! -f "$WORK/distill_m$M/eps.npy" ]; then
    [ -f "$WORK/calibration.txt" ] || xz -dc models/corpus/calibration.txt.xz > "$WORK/calibration.txt"
    "$BUILD/tools/record_qkv" --model "$MODEL" --text "$WORK/calibration.txt" --out "$WORK/distill_m$M" \
      --seqs 0 --draws "$M" --seed 0 --ids-out "$WORK/distill_ids.npy"
  fi
  stage "stage 2: distilling against the exact model, $DSTEPS steps (checkpoint $WORK/$TAG.s2.npz)"
  "$PY" tools/distill.py --model "$MODEL" --adapter "$WORK/$TAG.stage1.gguf" \
    --ids "$WORK/distill_ids.npy" --eps "$WORK/distill_m$M/eps.npy" --steps "$DSTEPS" \
    --lora "$LORA" --batch 2 --val-seqs 8 --val-every 25 --seed 2 --write-each \
    --ckpt "$WORK/$TAG.s2.npz" --log "$WORK/$TAG.s2.json" --out "$WORK/$TAG.s2"
  # The validated steps' parameters, chosen by perplexity at 1K chunks on
  # the corpus's last 24,000 bytes: inside distill.py's validation tokens
  # (never trained on), and a better guide than the validation KL, which
  # keeps falling after the held-out perplexities turn (models/adapters/README.md).
  tail -c 24000 "$WORK/calibration.txt" > "$WORK/select.txt"
  best="" best_ppl=""
  for mat in "$WORK/$TAG".s2.step*.mat.f32; do
    p=${mat%.mat.f32}
    write "$p" "$p.gguf" "$LORA"
    ppl=$("$BUILD/darkserve" perplexity --model "$MODEL" --adapter "$p.gguf" --file "$WORK/select.txt" \
            --chunk 1024 2>/dev/null | sed -n 's/^perplexity: \([0-9.]*\).*/\1/p')
    stage "stage 2, ${p##*.s2.}: selection perplexity $ppl"
    if [ -n "$ppl" ] && { [ -z "$best" ] || awk "BEGIN{exit !($ppl < $best_ppl)}"; }; then
      best=$p best_ppl=$ppl
    fi
  done
  [ -n "$best" ] || { echo "convert: no stage-2 step could be scored" >&2; exit 1; }
  serving "$best.gguf" "$OUT"
  stage "done: $OUT (${best##*.s2.}, selection perplexity $best_ppl)"
  exit 0
fi

if [ ! -f "$WORK/cal/meta.json" ]; then
  "$BUILD/tools/record_qkv" --model "$MODEL" --text tests/data/calibration.txt \
    --out "$WORK/cal" --seqs 40 --len 512 --draws 256 --seed 0
fi

if [ "$IS" = 1 ]; then
  OUT=${OUT:-$WORK/darkformer-is.gguf}
  "$PY" tools/convert.py lambda --rec "$WORK/cal" --out "$WORK/lambda.f32" --log "$WORK/lambda.json"
  "$BUILD/tools/write_adapter" --model "$MODEL" --kind darkformer-is --features "$M" \
    --window "$W" --seed 0 --lambda "$WORK/lambda.f32" --out "$OUT"
  exit 0
fi

OUT=${OUT:-$WORK/m${M}_w${W}.gguf}
init_args=()
[ -n "$INIT" ] && init_args=(--init "$INIT")
"$PY" tools/convert.py train --rec "$WORK/cal" --features "$M" --window "$W" --steps "$STEPS" \
  "${init_args[@]}" --out "$WORK/m${M}_w${W}.f32" --log "$WORK/m${M}_w${W}.json"
"$BUILD/tools/write_adapter" --model "$MODEL" --kind darkformer --features "$M" --window "$W" \
  --seed 0 --mat "$WORK/m${M}_w${W}.f32" --out "$OUT"
