#!/usr/bin/env bash
# The test command (CI runs it): ruff, the import contract, the unit tests, then the notebooks under nbval
# on the cpu profile.
#   ./run_tests.sh              everything
#   ./run_tests.sh --fast       ruff, the import contract and the unit tier (tests not marked slow: no tiny-model
#                               end-to-end runs, no nbval) on 2 pytest-xdist workers; prints its wall time (target:
#                               under 60 s on 2 cores)
#   ./run_tests.sh tests/x.py   extra pytest arguments replace the default selection
set -euo pipefail
cd "$(dirname "$0")"
source scripts/env.sh
if [ $# -gt 0 ] && [ "$1" != "--fast" ]; then
  exec "$PY" -m pytest "$@"
fi
start=$(date +%s%N)
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check artifact tests scripts benchmarks examples >/dev/null || \
  "$VENV/bin/ruff" format --check artifact tests scripts benchmarks examples   # line length 110 (pyproject.toml)
"$VENV/bin/lint-imports" --no-cache >/dev/null || "$VENV/bin/lint-imports" --no-cache   # details only on failure
if [ "${1:-}" = "--fast" ]; then
  "$PY" -m pytest tests -q -m "not slow" -n 2 -p no:nbval     # pytest-xdist: a worker per core of a 2-core machine
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  printf '[fast] ruff + import contract + unit tier: %d.%01d s wall\n' $((ms / 1000)) $((ms % 1000 / 100))
  exit 0
fi
# The unit tier on 2 pytest-xdist workers (as --fast); then nbval and the slow tier (tiny-model runs, jobs) side by
# side, one process each on a 2-core machine (no test asserts a time; nbval masks the wall-clock claim lines).
# nbval runs in the background and the slow tier in the foreground: bash starts a background command with SIGINT
# ignored, which its children inherit, and the slow tier stops jobs with SIGINT. nbval's output is printed when both
# are done; the exit code fails if either failed.
"$PY" -m pytest tests -q -m "not slow" -n 2 -p no:nbval
nbval_pid=""
# --- nbval ---------------------------------------------------------------------------------------------
# Claim cells are compared with their stored outputs; wall-clock figures are masked (see the cfg).
# Tests never overwrite a user's results: the notebooks write into a temporary data/ and figures/.
if ls notebooks/*.ipynb >/dev/null 2>&1; then
  nbval_out="$(mktemp -d)"
  trap 'rm -rf "$nbval_out"' EXIT
  mkdir -p "$nbval_out/data"
  ln -s "$PWD/data/tasks" "$nbval_out/data/tasks"
  ARTIFACT_DATA="$nbval_out/data" ARTIFACT_OUTPUT="$nbval_out/results" \
    "$PY" -m pytest -q --nbval-lax --nbval-sanitize-with notebooks/nbval_sanitize.cfg -p no:cacheprovider notebooks \
    >"$nbval_out/log" 2>&1 &
  nbval_pid=$!
fi
slow_rc=0
"$PY" -m pytest tests -q -m slow -p no:nbval || slow_rc=$?
nbval_rc=0
if [ -n "$nbval_pid" ]; then
  wait "$nbval_pid" || nbval_rc=$?
  echo "--- nbval (ran beside the slow tier) ---"
  cat "$nbval_out/log"
fi
[ "$slow_rc" -eq 0 ] && [ "$nbval_rc" -eq 0 ] || { echo "slow tier: exit $slow_rc; nbval: exit $nbval_rc" >&2; exit 1; }
# --- end nbval -----------------------------------------------------------------------------------------
