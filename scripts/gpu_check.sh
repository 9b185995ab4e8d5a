#!/usr/bin/env bash
# The GPU check, one command: environment, CUDA tests, pinned H2D peak, capped link, one MoE layer
# loop vs grouped, a 9 GB pinned store, the engine on a 6-layer mini-shaped random model; each step
# written to results/gpu_check.json (--out) as it ends. At most 6 minutes on one H200, no checkpoint,
# nothing downloaded or built. Arguments go to scripts/gpu_check.py (--help).
# Exit codes: 0 done, 1 GPU tests failed, 2 bad arguments, 3 no CUDA GPU visible (nothing run), 4 a step raised.
# `gpu_check.sh graphs [ARGS]` runs the graphs check alone (scripts/gpu_check_graphs.py: forward eager vs
# segmented on step 7's model, targets T1-T6); scripts/gpu_run.sh runs the CUDA tests and it in one budgeted run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ -x "$ROOT/.venv/bin/python" ] && "$ROOT/.venv/bin/python" -c "import torch" >/dev/null 2>&1; then
    PY="$ROOT/.venv/bin/python"
else
    PY="$(command -v python3)"
fi
# The checkout's package, whether or not it was pip-installed; no pip, so nothing is downloaded.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONHASHSEED=0
export ARTIFACT_CACHE="${ARTIFACT_CACHE:-$ROOT/.cache}"
if [ "${1:-}" = "graphs" ]; then
    shift
    exec "$PY" "$ROOT/scripts/gpu_check_graphs.py" "$@"
fi
exec "$PY" "$ROOT/scripts/gpu_check.py" "$@"
