#!/usr/bin/env bash
# make run: starts darkserve on the default model (DARKFormer attention with the
# committed adapter when it is there). A build without `serve` runs a demo
# generation instead.
set -euo pipefail
bin=$1 model=$2 port=$3
adapter=models/adapters/smollm2-135m.darkformer.gguf
if "$bin" serve --help >/dev/null 2>&1; then
  args=(serve --model "$model" --port "$port")
  # The committed DARKFormer adapter (docs/QUALITY.md) carries m, W and the
  # feature seed; without it the server runs exact attention.
  [ -f "$adapter" ] && args+=(--attn darkformer --adapter "$adapter")
  echo "run: $bin ${args[*]}"
  exec "$bin" "${args[@]}"
fi
echo "run: $bin generate --model $model --chat --prompt 'What is the capital of France?'"
exec "$bin" generate --model "$model" --chat --max-tokens 64 --prompt "What is the capital of France?"
