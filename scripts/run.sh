#!/usr/bin/env bash
# make run: starts darkserve on the default model. Until the HTTP server lands,
# it runs a demo generation.
set -euo pipefail
bin=$1 model=$2 port=$3
adapter=models/adapters/smollm2-135m.darkformer.gguf
if "$bin" serve --help >/dev/null 2>&1; then
  args=(serve --model "$model" --port "$port")
  [ -f "$adapter" ] && args+=(--adapter "$adapter")
  echo "run: $bin ${args[*]}"
  exec "$bin" "${args[@]}"
fi
echo "run: $bin generate --model $model --chat --prompt 'What is the capital of France?'"
exec "$bin" generate --model "$model" --chat --max-tokens 64 --prompt "What is the capital of France?"
