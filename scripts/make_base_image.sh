#!/usr/bin/env bash
# Makes the base image `debian:bookworm-slim` locally, without Docker or a
# registry: debootstrap --variant=minbase from the Debian mirror apt already
# uses, slimmed like the official -slim image (no docs, man pages, locales,
# apt lists), then imported into buildah's storage under the name the
# Dockerfile's FROM lines resolve to (docker.io/library/debian:bookworm-slim).
#
#   scripts/make_base_image.sh            # reuse the cache when it is fresh
#   DARKSERVE_BASE_REBUILD=1 scripts/make_base_image.sh
#
# Cache: $DARKSERVE_CTR_CACHE/base-<suite>-r<recipe>.tar (default
# /var/tmp/darkserve-ctr), rebuilt when older than DARKSERVE_BASE_MAX_AGE_DAYS
# (default 7; 0 = never) so security fixes come in. The image carries the
# tarball's key and checksum as labels; an image that matches is kept as is.
# Buildah storage: BUILDAH_DRIVER (overlay where the kernel allows it, else
# vfs), BUILDAH_ROOT ($cache/storage-$driver), BUILDAH_RUNROOT
# (/run/darkserve-ctr-<hash of the root>, tmpfs): a store of its own, the same one
# scripts/container_test.sh uses. Needs root (debootstrap, buildah mount).
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE=bookworm
RECIPE=2 # bump when the way the root filesystem is made changes
cache=${DARKSERVE_CTR_CACHE:-/var/tmp/darkserve-ctr}
max_age=${DARKSERVE_BASE_MAX_AGE_DAYS:-7}
mkdir -p "$cache"
# overlay when the kernel mounts overlayfs on the cache's filesystem (layers
# are diffs: fast, small); else vfs (every layer a full copy, works anywhere).
# Same rule as scripts/container_test.sh.
detect_driver() {
  local d
  # shellcheck disable=SC2015 # either failing means vfs
  d=$(mktemp -d "$cache/probe.XXXXXX") && mkdir -p "$d/l" "$d/u" "$d/w" "$d/m" || { echo vfs; return; }
  if mount -t overlay overlay -o "lowerdir=$d/l,upperdir=$d/u,workdir=$d/w" "$d/m" 2>/dev/null; then
    umount "$d/m"; echo overlay
  else
    echo vfs
  fi
  rm -rf "$d"
}
BUILDAH_DRIVER=${BUILDAH_DRIVER:-$(detect_driver)}
BUILDAH_ROOT=${BUILDAH_ROOT:-$cache/storage-$BUILDAH_DRIVER}
BUILDAH_RUNROOT=${BUILDAH_RUNROOT:-/run/darkserve-ctr-$(echo "$BUILDAH_ROOT" | sha1sum | cut -c1-12)}
image=docker.io/library/debian:$SUITE-slim
tarball=$cache/base-$SUITE-r$RECIPE.tar
key=$SUITE-minbase-r$RECIPE

say() { echo "base: $*"; }
die() { echo "base: error: $*" >&2; exit 1; }
bah() { buildah --root "$BUILDAH_ROOT" --runroot "$BUILDAH_RUNROOT" --storage-driver "$BUILDAH_DRIVER" "$@"; }

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap and buildah mount); run it as root or with sudo"

# --- tools ------------------------------------------------------------------
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v buildah >/dev/null || need+=(buildah)
[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=(debian-archive-keyring)
if [ ${#need[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "missing ${need[*]} and no apt-get to install them"
  say "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1; then
    apt-get update -qq || die "apt-get update failed (is the Debian mirror reachable?)"
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
      die "apt-get install ${need[*]} failed"
  fi
fi

# --- the Debian mirror apt uses (deb822 .sources or one-line sources.list) ---
# Prints the first URI whose suites include $1.
apt_uri() {
  local suite=$1 f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v s="$suite" '
      function flush() { if (u != "" && ok) print u; u = ""; ok = 0 }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      tolower($1) == "uris:" { u = $2 }
      tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == s) ok = 1 }
      END { flush() }' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    sed -E 's/\[[^]]*\]//' "$f" | awk -v s="$suite" '$1 == "deb" && $3 == s { print $2 }'
  done
  return 0
}
mirror=${DARKSERVE_DEBIAN_MIRROR:-$(apt_uri "$SUITE" | sed -n 1p)}
mirror=${mirror:-http://deb.debian.org/debian}
security=$(apt_uri "$SUITE-security" | sed -n 1p)
security=${security:-http://deb.debian.org/debian-security}

# --- is what we have fresh? ---------------------------------------------------
fresh_tar=0
if [ -f "$tarball" ] && [ "${DARKSERVE_BASE_REBUILD:-0}" != 1 ]; then
  age_days=$(( ($(date +%s) - $(stat -c %Y "$tarball")) / 86400 ))
  if [ "$max_age" = 0 ] || [ "$age_days" -lt "$max_age" ]; then
    fresh_tar=1
  else
    say "$tarball is $age_days days old (max $max_age): making a new one"
  fi
fi
if [ "$fresh_tar" = 1 ]; then
  sum=$(cat "$tarball.sha256" 2>/dev/null || true)
  have=$(bah inspect --type image --format '{{index .OCIv1.Config.Labels "org.darkserve.base.sha256"}}' "$image" 2>/dev/null || true)
  if [ -n "$sum" ] && [ "$have" = "$sum" ]; then
    say "$image is up to date ($key, $(date -r "$tarball" +%F))"
    exit 0
  fi
fi

# --- debootstrap -------------------------------------------------------------
if [ "$fresh_tar" != 1 ]; then
  rootfs=$cache/rootfs.tmp
  rm -rf "$rootfs"
  say "debootstrap --variant=minbase $SUITE from $mirror (about 1-2 minutes)"
  t0=$(date +%s)
  if ! debootstrap --variant=minbase --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
        "$SUITE" "$rootfs" "$mirror" >"$cache/debootstrap.log" 2>&1; then
    tail -n 20 "$cache/debootstrap.log" >&2
    die "debootstrap failed (full log: $cache/debootstrap.log); set DARKSERVE_DEBIAN_MIRROR to another mirror?"
  fi
  say "debootstrap done in $(( $(date +%s) - t0 )) s; slimming"
  # What the official -slim images leave out, and a dpkg filter so packages
  # installed later (the Dockerfile's apt-get) leave it out too.
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
# darkserve base image: no documentation or translations (like debian:*-slim)
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
  cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
# Containers do not keep downloaded .debs or the binary package caches.
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
EOF
  rm -f "$rootfs/etc/apt/sources.list"
  cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  # debootstrap installs the release as published; -updates and -security
  # come on top, as in the official images.
  say "apt-get upgrade from $SUITE-updates and $SUITE-security"
  cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
  mount -t proc proc "$rootfs/proc"
  trap 'umount "$rootfs/proc" 2>/dev/null || true' EXIT
  if ! chroot "$rootfs" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
        sh -c 'apt-get update -qq && apt-get -y -qq upgrade' >>"$cache/debootstrap.log" 2>&1; then
    tail -n 20 "$cache/debootstrap.log" >&2
    die "apt-get upgrade in the new root filesystem failed (log: $cache/debootstrap.log)"
  fi
  umount "$rootfs/proc"
  trap - EXIT
  find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$rootfs"/usr/share/{man,groff,info,lintian,linda,locale}/* \
         "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
         "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/* \
         "$rootfs"/var/cache/debconf/*-old "$rootfs"/var/lib/dpkg/*-old
  : >"$rootfs/etc/resolv.conf"
  : >"$rootfs/etc/hostname"
  [ -f "$rootfs/etc/machine-id" ] && : >"$rootfs/etc/machine-id"
  # /dev, /proc, /sys are the runtime's; only the empty folders go in.
  tar -C "$rootfs" --numeric-owner --xattrs --exclude='./dev/*' --exclude='./proc/*' \
      --exclude='./sys/*' --exclude='./run/*' -cf "$tarball.tmp" .
  sha256sum "$tarball.tmp" | cut -d' ' -f1 >"$tarball.sha256.tmp"
  mv "$tarball.tmp" "$tarball" && mv "$tarball.sha256.tmp" "$tarball.sha256"
  rm -rf "$rootfs"
  say "$tarball: $(du -h "$tarball" | cut -f1)"
fi
sum=$(cat "$tarball.sha256")

# --- import ------------------------------------------------------------------
# buildah 1.28 has no `import`: from scratch + mount + untar + commit.
say "importing into buildah ($BUILDAH_DRIVER storage at $BUILDAH_ROOT) as $image"
old=$(bah inspect --type image --format '{{.FromImageID}}' "$image" 2>/dev/null || true)
ctr=$(bah from --name darkserve-base-import-$$ scratch)
trap 'bah rm "$ctr" >/dev/null 2>&1 || true' EXIT
mnt=$(bah mount "$ctr")
tar -C "$mnt" --numeric-owner --xattrs -xf "$tarball"
bah umount "$ctr" >/dev/null
bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --cmd bash --label org.darkserve.base.key="$key" --label org.darkserve.base.sha256="$sum" \
  --label org.darkserve.base.mirror="$mirror" "$ctr"
bah commit --quiet --rm "$ctr" "$image" >/dev/null
trap - EXIT
if [ -n "$old" ] && [ "$old" != "$(bah inspect --type image --format '{{.FromImageID}}' "$image")" ]; then
  bah rmi "$old" >/dev/null 2>&1 || true # still used by cached layers: they go with `buildah rmi --prune`
fi
say "$image ready ($(bah images --format '{{.Size}}' "$image" | head -n1))"
