#!/usr/bin/env bash
# make cross-test: runs the aarch64 cross build's unit tests (BUILD dir as
# $1, built by make cross-aarch64) under qemu-aarch64-static on this machine.
#   1. run-time detection: the quantized-product tests on an emulated core
#      without dotprod (QEMU_CPU=cortex-a72) must choose the plain NEON path
#      and still pass, the reference and NEON paths bit for bit;
#   2. the core and proto unit tests on the emulated "max" core, which has
#      dotprod, so every ISA path of that core (generic, neon, neon-dotprod)
#      is checked against the scalar reference. A reduced suite: emulation
#      runs these tests ~10-40x slower than the host, so the five core tests
#      that take over 10 s there (SLOW below: whole-model and long-stream
#      runs that exercise no kernel the others do not) and the server's
#      test_srv_* are left out. CROSS_TESTS=all runs every unit test binary,
#      CROSS_TESTS="test_a test_b" those.
# The tiny model and the test data are the host's (the same bytes on every
# machine). UNIT_TIMEOUT (default 900 s) bounds each binary. On a shared
# 2-core AMD EPYC host at load ~8 the default suite took 10 to 16 min of
# wall time (about 4 min of CPU); at load ~13, with the packed NEON kernels,
# 23 min (254 checks).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-aarch64}
qemu=${QEMU:-qemu-aarch64-static}
command -v "$qemu" >/dev/null || { echo "cross-test: $qemu not found (scripts/deps_cross.sh)" >&2; exit 1; }
[ -x "$build/darkserve" ] || { echo "cross-test: no $build/darkserve (make cross-aarch64)" >&2; exit 1; }

export DARKSERVE_BIN=$PWD/$build/darkserve DARKSERVE_BUILD=$PWD/$build
export DARKSERVE_TINY_MODEL=$PWD/${TINY:-build/fixtures/tiny.gguf}
export DARKSERVE_TINY_GEMMA=$PWD/${TINY_GEMMA:-build/fixtures/tiny_gemma3.gguf}
export DARKSERVE_MODEL=$PWD/${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
export DARKSERVE_DATA=$PWD/tests/data
export UNIT_RUNNER=$qemu UNIT_TIMEOUT=${UNIT_TIMEOUT:-900}
t0=$(date +%s)

echo "cross-test: $("$qemu" "$build/darkserve" version | tr '\n' ' ')"
echo "cross-test: emulated cortex-a72 (no dotprod): the NEON path chosen"
QEMU_CPU=cortex-a72 DARKSERVE_EXPECT_BEST_ISA=neon scripts/run_unit.sh \
  "$build/tests/test_core_qdot_q8" "$build/tests/test_core_qdot" "$build/tests/test_core_half"

echo "cross-test: emulated max core (dotprod): the NEON-dotprod path chosen"
SLOW=" test_core_adapter_default test_core_attn_linear test_core_grammar test_core_longstream test_core_pool "
tests=()
case ${CROSS_TESTS:-} in
  all) for t in "$build"/tests/test_*; do [ -x "$t" ] && tests+=("$t"); done ;;
  "") for t in "$build"/tests/test_core_* "$build"/tests/test_proto_*; do
        [ -x "$t" ] && [[ $SLOW != *" $(basename "$t") "* ]] && tests+=("$t")
      done ;;
  *) for n in $CROSS_TESTS; do tests+=("$build/tests/$n"); done ;;
esac
QEMU_CPU=max DARKSERVE_EXPECT_BEST_ISA=neon-dotprod scripts/run_unit.sh "${tests[@]}"
echo "cross-test: ok ($(( $(date +%s) - t0 )) s)"
