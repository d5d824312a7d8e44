#!/usr/bin/env bash
# Builds the calibration corpus of the DARKFormer v2 attention conversion from
# Debian text packages of different kinds (see models/corpus/README.md):
#
#   prose          r-cran-janeaustenr   Jane Austen's six novels
#   technical      debian-reference-en  the Debian Reference (HTML)
#                  debian-policy        Debian Policy, Perl and menu policies,
#                                       debconf spec, copyright format (HTML)
#                  manpages             Linux man-pages, sections 1, 4, 5, 7
#   dialogue       fortunes, fortunes-min   fortune cookies (quotations,
#                                       IRC logs, jokes), a few files left out
#   code comments  libc6-dev, linux-libc-dev   comments of /usr/include/**.h
#
#   tools/make_corpus.sh [--install]
#
# What it does, all under build/corpus/ (idempotent: a .deb already in pkgs/
# is reused, everything else is rebuilt from it):
#   1. `apt-get download` of each package into pkgs/ (running `apt-get update`
#      first only if a download fails); nothing is installed, except
#      groff-base with apt-get if `groff` is missing (man pages need it);
#   2. `dpkg-deb -x` of each into root/<package>/;
#   3. `tools/extract_text.py corpus`: strips markup (HTML with Python's
#      html.parser, man pages with groff -Tutf8 -P-cbou, R data read from the
#      package's lazy-load database), reflows prose paragraphs to one line,
#      normalizes whitespace lightly, drops any paragraph sharing a line of
#      over 60 characters or a run of 13 words with a held-out text, and
#      writes parts/<source>.txt and calibration.txt (the sources
#      interleaved by document, so any prefix is a mix);
#   4. sizes.tsv: bytes and SmolLM2 tokens per part (HF tokenizers with the
#      vocabulary of models/SmolLM2-135M-Instruct.Q4_1.gguf, from .venv;
#      bytes/4.2 without it) and manifest.tsv: package, version, sha256;
#   5. checks that no line longer than 60 characters and no run of 13 words
#      of the held-out texts (tests/data/heldout*.txt, tests/data/long/*.txt)
#      is in calibration.txt (fails otherwise).
# --install also writes models/corpus/calibration.txt.xz (xz -9e, one thread,
# so the same input gives the same bytes) and models/corpus/sizes.tsv and
# models/corpus/manifest.tsv. To use the committed corpus without apt:
#   xz -dc models/corpus/calibration.txt.xz > build/corpus/calibration.txt
set -euo pipefail
cd "$(dirname "$0")/.."
install=0
case ${1:-} in --install) install=1 ;; "") ;; *) echo "usage: $0 [--install]" >&2; exit 2 ;; esac

PACKAGES="r-cran-janeaustenr debian-reference-en debian-policy manpages fortunes fortunes-min libc6-dev linux-libc-dev"
out=build/corpus
mkdir -p "$out/pkgs" "$out/root"

if ! command -v groff >/dev/null; then
  echo "groff is missing: apt-get install groff-base"
  apt-get install -y --no-install-recommends groff-base >/dev/null
fi

updated=0
for p in $PACKAGES; do
  if ! ls "$out/pkgs/${p}"_*.deb >/dev/null 2>&1; then
    echo "apt-get download $p"
    if ! (cd "$out/pkgs" && apt-get download "$p" 2>/dev/null); then
      if [[ $updated == 0 ]]; then
        echo "apt-get update"; apt-get update -qq; updated=1
      fi
      (cd "$out/pkgs" && apt-get download "$p")
    fi
  fi
done

: > "$out/manifest.tsv.new"
for p in $PACKAGES; do
  deb=$(ls "$out/pkgs/${p}"_*.deb | sort -V | tail -1)
  rm -rf "$out/root/$p"
  dpkg-deb -x "$deb" "$out/root/$p"
  printf '%s\t%s\t%s\n' "$p" "$(dpkg-deb -f "$deb" Version)" \
    "$(sha256sum "$deb" | cut -d' ' -f1)" >> "$out/manifest.tsv.new"
  echo "unpacked $(basename "$deb")"
done
mv "$out/manifest.tsv.new" "$out/manifest.tsv"

held=(tests/data/heldout.txt tests/data/heldout2.txt tests/data/long/*.txt)
excl=()
for h in "${held[@]}"; do [[ -f $h ]] && excl+=(--exclude "$h"); done
rm -rf "$out/parts"
python3 tools/extract_text.py corpus "$out/root" "$out" "${excl[@]}"

py=python3
if [[ -x .venv/bin/python ]] && .venv/bin/python -c 'import tokenizers, gguf' 2>/dev/null; then
  py=.venv/bin/python
fi
{
  printf 'file\tbytes\ttokens\n'
  $py tools/extract_text.py count "$out"/parts/*.txt "$out/calibration.txt" | sed "s|^$out/||"
} > "$out/sizes.tsv"
column -t -s $'\t' "$out/sizes.tsv"

echo "overlap with the held-out texts:"
python3 tools/extract_text.py overlap "$out/calibration.txt" "${held[@]}"

if [[ $install == 1 ]]; then
  mkdir -p models/corpus
  xz -9e -T1 -c "$out/calibration.txt" > models/corpus/calibration.txt.xz
  cp "$out/sizes.tsv" "$out/manifest.tsv" models/corpus/
  echo "wrote models/corpus/calibration.txt.xz ($(wc -c < models/corpus/calibration.txt.xz) bytes)"
fi
echo "sha256 of $out/calibration.txt: $(sha256sum "$out/calibration.txt" | cut -d' ' -f1)"
