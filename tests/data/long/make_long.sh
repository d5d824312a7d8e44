#!/usr/bin/env bash
# Regenerates tests/data/long/kjv_genesis_exodus.txt, the long document of the
# long-context measurements in docs/QUALITY.md: the books of Genesis and
# Exodus of the King James Version (public domain, see README.md), printed by
# the `bible` command of Debian's bible-kjv package, one paragraph per
# chapter (a "Book N" heading line, then the chapter's verses reflowed into
# one line, verse numbers dropped), books in canonical order.
#   apt-get install bible-kjv && tests/data/long/make_long.sh
set -euo pipefail
out=${1:-$(dirname "$0")/kjv_genesis_exodus.txt}
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
