#!/usr/bin/env bash
# Installs what darkserve needs to build and test, and says what it does.
#   Debian packages (apt-get) for the C libraries and tools (and Chromium,
#   for the browser tests of the web page),
#   a project-local virtualenv (.venv) with tests/requirements.txt for the
#   Python oracles and integration tests.
# Idempotent: a second run with everything present prints one line.
set -euo pipefail
cd "$(dirname "$0")/.."

# pkg-config name / header  ->  Debian package
need_debs=()
check() { # $1 = test command, $2 = Debian package, $3 = what it is
  if ! eval "$1" >/dev/null 2>&1; then need_debs+=("$2"); echo "deps: missing $3 (Debian package $2)"; fi
}
check 'command -v cc'                              gcc               "a C compiler"
check 'command -v make'                            make              "make"
check 'command -v pkg-config'                      pkg-config        "pkg-config"
check 'pkg-config --exists openblas'               libopenblas-dev   "OpenBLAS headers"
check 'pkg-config --exists jansson'                libjansson-dev    "jansson headers"
check 'pkg-config --exists libmicrohttpd'          libmicrohttpd-dev "libmicrohttpd headers"
check 'pkg-config --exists libuv'                  libuv1-dev        "libuv headers"
check 'pkg-config --exists libpcre2-8'             libpcre2-dev      "PCRE2 headers"
check 'pkg-config --exists hiredis'                libhiredis-dev    "hiredis headers (the Redis session store)"
check 'command -v python3'                         python3           "python3"
check 'python3 -c "import ensurepip, venv"'        python3-venv      "python3 venv module"
check 'command -v curl'                            curl              "curl"
check 'command -v chromium'                        chromium          "Chromium (browser tests of the web page)"
check 'command -v chromedriver'                    chromium-driver   "chromedriver (browser tests of the web page)"
check 'command -v redis-server'                    redis-server      "redis-server (the scale-out test)"
check 'command -v cppcheck'                        cppcheck          "cppcheck (make lint)"
check 'command -v clang-tidy'                      clang-tidy        "clang-tidy (make lint)"
check 'test -x /usr/sbin/nginx'                    nginx             "nginx (nginx -t over deploy/'s configurations, the scale-out test)"

if [ ${#need_debs[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null; then
    echo "deps: please install: ${need_debs[*]} (need root for apt-get)" >&2; exit 1
  fi
  SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "deps: apt-get install ${need_debs[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_debs[@]}" >/dev/null
fi

req=tests/requirements.txt
stamp=.venv/.requirements.sha256
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ ! -x .venv/bin/python ]; then
  echo "deps: creating virtualenv .venv"
  python3 -m venv .venv
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "deps: pip install -r $req into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check -r "$req"
  echo "$want" > "$stamp"
fi
echo "deps: ok"
