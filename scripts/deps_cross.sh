#!/usr/bin/env bash
# Installs what the aarch64 cross build and its emulated tests need (make
# cross-aarch64, make cross-test), and says what it does: Debian's
# cross-compiler, qemu-user-static, and the arm64 builds of the libraries the
# tree links (dpkg --add-architecture arm64; Debian's multiarch puts them in
# /usr/lib/aarch64-linux-gnu beside this machine's own). Debian bookworm on
# x86-64 is what this was written on. Idempotent: a second run with
# everything present prints one line.
set -euo pipefail

# test command -> Debian package
need_debs=()
check() { # $1 = test command, $2 = Debian package, $3 = what it is
  if ! eval "$1" >/dev/null 2>&1; then need_debs+=("$2"); echo "deps-cross: missing $3 (Debian package $2)"; fi
}
arm_pc() { PKG_CONFIG_LIBDIR=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig pkg-config --exists "$1"; }
check 'command -v aarch64-linux-gnu-gcc'   gcc-aarch64-linux-gnu     "the aarch64 cross-compiler"
check 'command -v qemu-aarch64-static'     qemu-user-static          "qemu-aarch64-static (runs the aarch64 tests)"
check 'arm_pc openblas'                    libopenblas-dev:arm64     "OpenBLAS for arm64"
check 'arm_pc libpcre2-8'                  libpcre2-dev:arm64        "PCRE2 for arm64"
check 'arm_pc jansson'                     libjansson-dev:arm64      "jansson for arm64"
check 'arm_pc libmicrohttpd'               libmicrohttpd-dev:arm64   "libmicrohttpd for arm64"
check 'arm_pc libuv'                       libuv1-dev:arm64          "libuv for arm64"
check 'arm_pc hiredis'                     libhiredis-dev:arm64      "hiredis for arm64"

if [ ${#need_debs[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null; then
    echo "deps-cross: please install: ${need_debs[*]} (need root for apt-get)" >&2; exit 1
  fi
  SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "deps-cross: dpkg --add-architecture arm64"
    $SUDO dpkg --add-architecture arm64
  fi
  echo "deps-cross: apt-get install ${need_debs[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_debs[@]}" >/dev/null
fi
echo "deps-cross: ok"
