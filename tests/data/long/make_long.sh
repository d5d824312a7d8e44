#!/usr/bin/env bash
# Regenerates the long held-out documents of tests/data/long/ (see README.md):
#
#   make_long.sh [kjv|gnu|all]        (default: all)
#
# kjv: kjv_genesis_exodus.txt, the long document of the long-context
#   measurements in docs/QUALITY.md: the books of Genesis and Exodus of the
#   King James Version (public domain), printed by the `bible` command of
#   Debian's bible-kjv package, one paragraph per chapter (a "Book N" heading
#   line, then the chapter's verses reflowed into one line, verse numbers
#   dropped), books in canonical order. Needs `apt-get install bible-kjv`.
#
# gnu: gnu_standards.txt, the second long held-out text: "GNU Coding
#   Standards" and "Information for Maintainers of GNU Software" (GFDL 1.3+,
#   no invariant sections) from Debian's gnu-standards package, which is
#   fetched with `apt-get download` into build/corpus/pkgs and unpacked with
#   `dpkg-deb -x` (not installed), then turned into text by
#   `tools/extract_text.py gnu-standards`; plus ../heldout2.txt, its first
#   ~22 KB cut at a line end, for short-context evaluation.
#
# Neither text may ever be part of the calibration corpus (tools/make_corpus.sh
# excludes them and checks that it shares no line with them).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
what=${1:-all}
case $what in kjv|gnu|all) ;; *) echo "usage: $0 [kjv|gnu|all]" >&2; exit 2 ;; esac

if [[ $what == kjv || $what == all ]]; then
  out=$here/kjv_genesis_exodus.txt
  {
    bible "Gen1:1-50:26"
    bible "Exo1:1-40:38"
  } | awk '
    /^(Genesis|Exodus) [0-9]+$/ { if (para != "") print para "\n"; print $0; para = ""; next }
    /^  *[0-9]+ / { sub(/^ *[0-9]+ /, ""); para = (para == "" ? $0 : para " " $0); next }
    /^$/ { next }
    { para = para " " $0 }
    END { if (para != "") print para }
  ' > "$out"
  echo "wrote $out ($(wc -c < "$out") bytes)"
fi

if [[ $what == gnu || $what == all ]]; then
  pkgs=$repo/build/corpus/pkgs
  root=$repo/build/corpus/root
  mkdir -p "$pkgs" "$root"
  if ! ls "$pkgs"/gnu-standards_*.deb >/dev/null 2>&1; then
    echo "apt-get download gnu-standards (into $pkgs)"
    (cd "$pkgs" && { apt-get download gnu-standards 2>/dev/null ||
                     { apt-get update -qq && apt-get download gnu-standards; }; })
  fi
  deb=$(ls "$pkgs"/gnu-standards_*.deb | sort -V | tail -1)
  echo "using $(basename "$deb") (version $(dpkg-deb -f "$deb" Version); README.md names the one the committed text comes from)"
  rm -rf "$root/gnu-standards"
  dpkg-deb -x "$deb" "$root/gnu-standards"
  out=$here/gnu_standards.txt
  python3 "$repo/tools/extract_text.py" gnu-standards "$root" "$out"
  echo "wrote $out ($(wc -c < "$out") bytes)"
  # The first ~22 KB, cut after the last whole (non-empty) line that fits.
  short=$here/../heldout2.txt
  LC_ALL=C awk -v max=22000 '
    { n += length($0) + 1; if (n > max) exit }
    /^$/ { blank = blank "\n"; next }
    { printf "%s%s\n", blank, $0; blank = "" }' "$out" > "$short"
  echo "wrote $(cd "$(dirname "$short")" && pwd)/heldout2.txt ($(wc -c < "$short") bytes)"
fi
