#!/usr/bin/env bash
# make check-layers: the layering of the tree as a check. Dependencies point
# one way, server -> proto and server -> core (see the Makefile's header):
#   core/   includes no proto/ or server/ header, nor jansson, libmicrohttpd,
#           libuv or hiredis; OpenBLAS only in core/kernels/blas.c, PCRE2 only in the
#           tokenizer;
#   proto/  includes no core/ or server/ header, nor BLAS, PCRE2, libuv,
#           libmicrohttpd or hiredis;
# no file reaches another layer through a relative "../" include; and a
# test-support header (*_test.h) is included only where it is implemented.
#
# Inside the layers, the modules (folders; docs/DESIGN.md §1):
#   core/kernels/  the products, vector maths, thread pool and CPU probe:
#                  no core/attn/ or core/text/, nothing of core/'s top but
#                  err.h and tensor.h;
#   core/attn/     attention: no core/text/, and not the model, state,
#                  sampler or LoRA above it;
#   core/text/     tokenizer, chat templates, grammars: no core/attn/ or
#                  core/kernels/, and not the model, state, sampler or LoRA;
#   server/base/   logging, metrics, ids, hashing: nothing else of server/;
#   server/http/   the HTTP server: server/base/ only, no core/;
#   server/engine/ the scheduler: server/base/ and core/ only;
#   server/store/  sessions and the prefix cache: server/base/ and the
#                  engine's types, no api/, http/, cli/ or ui/;
#   server/cli/    the terminal client and local commands: no api/, engine/,
#                  store/, http/ or ui/ (it talks HTTP through its own client);
#   server/ui/     the web page: server/http/ and server/base/ only.
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
    [ -d "$dir" ] || return 0
    hits=$(find "$dir" \( -name '*.c' -o -name '*.h' \) -print0 | sort -z |
        xargs -0 -r grep -HnE "^[[:space:]]*#[[:space:]]*include[[:space:]]*[<\"]($pat)" 2>/dev/null)
    [ -n "$allow" ] && hits=$(printf '%s\n' "$hits" | grep -vE "^($allow):" || true)
    if [ -n "$hits" ]; then
        printf '%s\n' "$hits" | sed "s|\$|    <- $why|"
        bad=1
    fi
}

check core 'proto/|server/' 'core must not include proto/ or server/'
check core 'jansson\.h|microhttpd\.h|uv\.h|uv/|hiredis/' 'core knows no JSON, HTTP, event loop or Redis'
check core 'cblas\.h|openblas' 'OpenBLAS only through core/kernels/blas.c' 'core/kernels/blas\.c'
check core 'pcre2\.h' 'PCRE2 only in the tokenizer' 'core/text/tokenizer[a-z_]*\.[ch]'
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
    'server/(http/http|http/http_stream|engine/engine|engine/engine_jobs|store/prefix_cache|store/store|store/store_redis)\.c'
check proto "$test_h" 'a *_test.h header is for tests only' 'proto/util\.c'
check core "$test_h" 'a *_test.h header is for tests only'

# the modules inside the layers
upper='core/(model|state|sample|lora)\.h'
check core/kernels "core/(attn|text)/|$upper|core/(gguf|le|rng|crc32|atomic_file|chat)\.h" \
    'core/kernels/ uses only core/err.h and core/tensor.h of the core'
check core/attn "core/text/|$upper" 'core/attn/ is below the model and knows no text'
check core/text "core/(attn|kernels)/|$upper" 'core/text/ knows no attention or kernels'
check server/base 'server/(http|engine|store|api|cli|ui)/|server/[a-z_]+\.h' \
    'server/base/ includes nothing else of server/'
check server/http 'server/(engine|store|api|cli|ui)/|server/[a-z_]+\.h|core/' \
    'server/http/ builds on server/base/ only'
check server/engine 'server/(http|store|api|cli|ui)/|server/[a-z_]+\.h|proto/' \
    'server/engine/ builds on server/base/ and core/ only'
check server/store 'server/(http|api|cli|ui)/|server/[a-z_]+\.h' \
    'server/store/ builds on server/base/, the engine types, core/ and proto/'
check server/cli 'server/(api|engine|store|http|ui)/' \
    'server/cli/ talks to a server over HTTP, never through its modules'
check server/ui 'server/(engine|store|api|cli)/|server/[a-z_]+\.h|core/' \
    'server/ui/ builds on server/http/ and server/base/ only'

if [ $bad -ne 0 ]; then
    echo "check-layers: FAILED"
    exit 1
fi
echo "check-layers: ok"
