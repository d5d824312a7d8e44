#!/usr/bin/env bash
# make run: serves MODEL on 127.0.0.1:PORT. MODEL is a model's short name
# (smollm2-135m, gemma3-270m), a GGUF path, or several of those separated by
# commas (the first is the default model; requests pick the others by their
# "model" field). A known model (by short name, or its file in models/) is
# fetched when missing and its SHA-256 checked against models/SHA256SUMS
# (scripts/fetch_model.sh, scripts/fetch_gemma.sh); any other path must exist.
# Attention is the default, --attn auto: DARKFormer with the model's adapter,
# which darkserve finds beside the model (models/adapters/<model
# name>.darkformer.gguf, committed); without one it falls back to a
# training-free configuration (or exact attention) and says so. A build
# without `serve` runs a demo generation instead.
# RUN_DRY=1 prints the command instead of running it (and fetches nothing).
set -euo pipefail
bin=$1 models=$2 port=$3
root=$(cd "$(dirname "$0")/.." && pwd)

# short name -> "file fetch-script"
known() {
  case "$(printf '%s' "$1" | tr '[:upper:]' '[:lower:]')" in
    smollm2-135m|smollm2-135m-instruct.q4_1.gguf) echo "SmolLM2-135M-Instruct.Q4_1.gguf fetch_model.sh" ;;
    gemma3-270m|gemma-3-270m-q4_k_m.gguf) echo "gemma-3-270m-q4_k_m.gguf fetch_gemma.sh" ;;
    *) return 1 ;;
  esac
}

args=()
IFS=',' read -ra list <<<"$models"
for m in "${list[@]}"; do
  m=$(printf '%s' "$m" | sed 's/^[[:space:]]*//; s/[[:space:]]*$//')
  [ -n "$m" ] || continue
  path=$m
  # a short name, or a known model's file in models/
  if k=$(known "$m" || known "$(basename "$m")"); then
    file=${k% *} fetch=${k#* }
    if [ "$m" = "$(basename "$m")" ] || [ "$(cd "$(dirname "$m")" 2>/dev/null && pwd)" = "$root/models" ]; then
      path=models/$file
      if [ -z "${RUN_DRY:-}" ]; then
        "$root/scripts/$fetch"
      fi
    fi
  fi
  if [ -z "${RUN_DRY:-}" ] && [ ! -f "$path" ]; then
    echo "run: no model '$m': give a GGUF path or a known short name (smollm2-135m, gemma3-270m)" >&2
    exit 2
  fi
  args+=(--model "$path")
done
if [ ${#args[@]} -eq 0 ]; then
  echo "run: MODEL names no model" >&2
  exit 2
fi

if [ -n "${RUN_DRY:-}" ]; then
  echo "$bin serve ${args[*]} --port $port"
  exit 0
fi
if "$bin" serve --help >/dev/null 2>&1; then
  echo "run: $bin serve ${args[*]} --port $port"
  exec "$bin" serve "${args[@]}" --port "$port"
fi
echo "run: $bin generate ${args[*]:0:2} --chat --prompt 'What is the capital of France?'"
exec "$bin" generate "${args[@]:0:2}" --chat --max-tokens 64 --prompt "What is the capital of France?"
