#!/usr/bin/env bash
# The test command (CI runs it): unit tests, then the notebooks under nbval on the cpu profile.
#   ./run_tests.sh            everything
#   ./run_tests.sh tests/x.py extra pytest arguments replace the default selection
set -euo pipefail
cd "$(dirname "$0")"
source scripts/env.sh
if [ $# -gt 0 ]; then
  exec "$PY" -m pytest "$@"
fi
"$PY" -m pytest tests -q
if ls notebooks/*.ipynb >/dev/null 2>&1; then
  # Claim cells are compared with their stored outputs; wall-clock figures are masked (see the cfg).
  "$PY" -m pytest -q --nbval-lax --nbval-sanitize-with notebooks/nbval_sanitize.cfg -p no:cacheprovider notebooks
fi
