#!/usr/bin/env bash
# make check-layers: the layering of the tree as a check. Dependencies point
# one way, server -> proto and server -> core (see the Makefile's header):
#   core/   includes no proto/ or server/ header, nor jansson, libmicrohttpd,
#           libuv or hiredis; OpenBLAS only in core/blas.c, PCRE2 only in the
#           tokenizer;
#   proto/  includes no core/ or server/ header, nor BLAS, PCRE2, libuv,
#           libmicrohttpd or hiredis;
# no file reaches another layer through a relative "../" include; and a
# test-support header (*_test.h) is included only where it is implemented.
# The static libraries catch a wrong call at link time; this catches a wrong
# include even when only a type or a macro is used. Prints each offending
# line as file:line: text and exits 1 when there is one.
set -u
cd "$(dirname "$0")/.."

bad=0
# check DIR PATTERN WHY [ALLOWED_FILE_REGEX]
check() {
    local dir=$1 pat=$2 why=$3 allow=${4:-}
    local hits
    hits=$(grep -nE "^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]($pat)" \
        "$dir"/*.c "$dir"/*.h 2>/dev/null)
    [ -n "$allow" ] && hits=$(printf '%s\n' "$hits" | grep -vE "^($allow):" || true)
    if [ -n "$hits" ]; then
        printf '%s\n' "$hits" | sed "s|\$|    <- $why|"
        bad=1
    fi
}

check core 'proto/|server/' 'core must not include proto/ or server/'
check core 'jansson\.h|microhttpd\.h|uv\.h|uv/|hiredis/' 'core knows no JSON, HTTP, event loop or Redis'
check core 'cblas\.h|openblas' 'OpenBLAS only through core/blas.c' 'core/blas\.c'
check core 'pcre2\.h' 'PCRE2 only in the tokenizer' 'core/tokenizer[a-z_]*\.[ch]'
check proto 'core/|server/' 'proto must not include core/ or server/'
check proto 'cblas\.h|openblas|pcre2\.h|microhttpd\.h|uv\.h|uv/|hiredis/' \
    'proto uses libc and jansson only'
for d in core proto server; do
    check "$d" '\.\./' 'no relative include across layers'
done
# A *_test.h header declares what only tests and fuzz targets call: in the
# layers, only the files that implement it include it.
test_h='([a-z]+/)?[a-z_]*_test\.h'
check server "$test_h" 'a *_test.h header is for tests only' \
    'server/(http|http_stream|engine|engine_jobs|prefix_cache|store|store_redis)\.c'
check proto "$test_h" 'a *_test.h header is for tests only' 'proto/util\.c'
check core "$test_h" 'a *_test.h header is for tests only'

if [ $bad -ne 0 ]; then
    echo "check-layers: FAILED"
    exit 1
fi
echo "check-layers: ok"
