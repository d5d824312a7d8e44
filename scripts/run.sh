#!/usr/bin/env bash
# make run: starts darkserve on the default model. Attention is the default,
# --attn auto: DARKFormer with the model's adapter, which darkserve finds
# beside the model (models/adapters/<model name>.darkformer.gguf, committed);
# without one it falls back to a training-free configuration and says so.
# A build without `serve` runs a demo generation instead.
set -euo pipefail
bin=$1 model=$2 port=$3
if "$bin" serve --help >/dev/null 2>&1; then
  args=(serve --model "$model" --port "$port")
  echo "run: $bin ${args[*]}"
  exec "$bin" "${args[@]}"
fi
echo "run: $bin generate --model $model --chat --prompt 'What is the capital of France?'"
exec "$bin" generate --model "$model" --chat --max-tokens 64 --prompt "What is the capital of France?"
