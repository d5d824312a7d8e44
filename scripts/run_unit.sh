#!/usr/bin/env bash
# Runs each unit-test binary in its own process with a timeout and sums the
# results. Each binary prints "N passed, N failed" as its last line.
# UNIT_RUNNER, when set, is the command each binary runs under (make
# cross-test: qemu-aarch64-static).
set -u
pass=0; fail=0; broken=()
for t in "$@"; do
  # shellcheck disable=SC2086 # the runner is a command and its words
  out=$(timeout "${UNIT_TIMEOUT:-300}" ${UNIT_RUNNER:-} "$t" 2>&1); rc=$?
  line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -1)
  if [ -n "$line" ]; then
    p=${line%% passed*}; f=${line#*, }; f=${f%% failed*}
    pass=$((pass + p)); fail=$((fail + f))
  fi
  if [ $rc -ne 0 ] || [ -z "$line" ]; then
    broken+=("$(basename "$t") (exit $rc)")
    printf '%s\n' "$out" | tail -30
    [ -z "$line" ] && fail=$((fail + 1))
  else
    echo "unit: $(basename "$t"): $line"
  fi
done
[ ${#broken[@]} -gt 0 ] && echo "unit: failing binaries: ${broken[*]}"
echo "unit: $pass passed, $fail failed"
[ ${#broken[@]} -eq 0 ] && [ $fail -eq 0 ]
