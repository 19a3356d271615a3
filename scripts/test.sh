#!/usr/bin/env bash
# `just test [ARGS]`: the suite in a few pytest processes, one per group of test folders.
# Separate processes keep one group's leftover native state (mapped arenas, tinygrad and
# cffi objects awaiting garbage collection) out of the next group: a full single-process
# run has crashed during garbage collection (see the open note in the README), and a crash
# must cost one group, not hide the others' results. ARGS that name paths run as one
# pytest call, as usual.
set -uo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
for arg in "$@"; do
  case "$arg" in -*) ;; *) exec "$py" -m pytest "$@" ;; esac
done
groups=(
  "tests/generated tests/codegen tests/wire tests/events tests/actors tests/bench"
  "tests/arena tests/ring tests/worker tests/transport tests/edges tests/membership"
  "tests/model tests/node tests/orchestrator"
  "tests/e2e tests/cluster"
  "tests/faults"
  "tests/multihost"
)
# A test folder missing from the groups would silently never run: refuse that.
for dir in tests/*/; do
  dir=${dir%/}; [[ $(basename "$dir") == _* ]] && continue
  [[ " ${groups[*]} " == *" $dir "* ]] || { echo "scripts/test.sh: $dir is in no group" >&2; exit 2; }
done
failed=0
for group in "${groups[@]}"; do
  echo "== pytest $group"
  # shellcheck disable=SC2086
  "$py" -m pytest "$@" $group
  rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then failed=1; echo "== FAILED ($rc): $group"; fi
done
exit "$failed"
