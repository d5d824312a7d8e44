#!/usr/bin/env bash
# Runs the given unit-test binaries (the kernel and model tests) once more on
# every kernel path this CPU runs other than its best, which `make unit` has
# just tested: DARKSERVE_ISA=<path> puts each whole process on that path
# (core/kernels/cpu.h). So an AVX-512 host proves the AVX2 and generic
# kernels too. The paths come from `darkserve version` ("qdot paths: ...").
# Needs DARKSERVE_BIN; the binaries as scripts/run_unit.sh takes them.
set -u
here=$(dirname "$0")
info=$(env -u DARKSERVE_ISA "$DARKSERVE_BIN" version) || exit 1
best=$(printf '%s\n' "$info" | sed -n 's/^qdot: //p')
paths=$(printf '%s\n' "$info" | sed -n 's/^qdot paths: //p')
[ -n "$best" ] && [ -n "$paths" ] || { echo "unit-isa: no qdot paths in '$DARKSERVE_BIN version'"; exit 1; }
rc=0
for p in $paths; do
  [ "$p" = "$best" ] && continue
  echo "unit-isa: DARKSERVE_ISA=$p"
  DARKSERVE_ISA=$p "$here/run_unit.sh" "$@" | sed "s/^unit:/unit[$p]:/" || rc=1
done
exit $rc
