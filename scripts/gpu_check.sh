#!/usr/bin/env bash
# One command for a machine with one GPU and this project checked out: the GPU tests, the H2D engine
# check and a short paired demand vs last_step run, summarised in results/gpu_check.json (--out).
# Under 8 minutes, nothing downloaded or built. Arguments go to scripts/gpu_check.py (--help, --quick).
# Exit codes: 0 done, 1 GPU tests failed, 2 bad arguments, 3 no CUDA GPU visible (nothing run).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY="$(command -v python3)"; fi
# The checkout's package, whether or not it was pip-installed; no pip, so nothing is downloaded.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONHASHSEED=0
export ARTIFACT_CACHE="${ARTIFACT_CACHE:-$ROOT/.cache}"
exec "$PY" "$ROOT/scripts/gpu_check.py" "$@"
