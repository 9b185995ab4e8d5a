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
  "$PY" -m pytest -q --nbval-lax -p no:cacheprovider notebooks
fi
