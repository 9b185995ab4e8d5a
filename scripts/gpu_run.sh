#!/usr/bin/env bash
# One prepared GPU run, at most 8 minutes on one H200, no checkpoint, nothing downloaded or installed:
#   1. environment  python, torch, CUDA, the GPU, which packages import         (scripts/gpu_run.py)
#   2. cuda_tests   the CUDA tests that matter, an explicit list of files       (scripts/gpu_tests.py)
#   3. graphs       the graphs check, forward eager vs segmented, T1-T6         (scripts/gpu_check_graphs.py)
#   4. summary      each step's result, T1-T6 with their verdicts, the reports to commit (scripts/gpu_run.py)
# Each step runs under `timeout` with its budget (printed), on whatever torch the machine has: the checkout's
# .venv where it was carried and imports torch, else the image's python3, with the checkout on PYTHONPATH.
# Each step's result is written under --out (atomically) as soon as it ends: NAME_gpu_run.STEP.json; the graphs
# check writes each of its rows as it measures it (NAME_graphs.json), the tests their JSON and log.
#
#   scripts/gpu_run.sh [--out DIR] [--name NAME] [--dry-run]
#     --out DIR   where the reports go (default data/gpu_check; --dry-run: results/gpu_run_dry)
#     --name      the reports' prefix (default h200; --dry-run: cpu): DIR/h200_graphs.json is what the
#                 performance model reads (artifact/experiments/hardware.py GPU_CHECK_GRAPHS)
#     --dry-run   the same steps on the CPU with tiny shapes (under 2 minutes): the CUDA tests skip with
#                 their reason and T1-T6 read unmeasured
# ARTIFACT_NO_MEMCPY_BATCH=1 in the environment turns the batched copy (cudaMemcpyBatchAsync) off: the CUDA
# link copies with its copy_ loop (an A/B run of the two paths).
# Exit codes: 0 every step ended in time (the verdicts are in the output); 1 a step failed or ran out of time;
# 2 bad arguments; 3 no CUDA GPU visible (only the environment step ran).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="" NAME="" DRY=0
while [ $# -gt 0 ]; do
    case "$1" in
        --out) [ $# -ge 2 ] || { echo "gpu_run: --out needs a folder" >&2; exit 2; }; OUT="$2"; shift 2 ;;
        --name) [ $# -ge 2 ] || { echo "gpu_run: --name needs a name" >&2; exit 2; }; NAME="$2"; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        -h|--help) sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu_run: unknown argument '$1'; expected --out DIR, --name NAME, --dry-run" >&2; exit 2 ;;
    esac
done
if [ "$DRY" = 1 ]; then OUT="${OUT:-results/gpu_run_dry}"; NAME="${NAME:-cpu}"; else OUT="${OUT:-data/gpu_check}"; NAME="${NAME:-h200}"; fi
mkdir -p "$OUT" || { echo "gpu_run: cannot create --out $OUT" >&2; exit 2; }
OUT="$(cd "$OUT" && pwd)"
if [ -x "$ROOT/.venv/bin/python" ] && "$ROOT/.venv/bin/python" -c "import torch" >/dev/null 2>&1; then
    PY="$ROOT/.venv/bin/python"
else
    PY="$(command -v python3 || command -v python)"
fi
export PYTHONPATH="$ROOT:$ROOT/scripts${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONHASHSEED=0
export ARTIFACT_CACHE="${ARTIFACT_CACHE:-$ROOT/.cache}"

# Budgets in seconds, each with KILL_S of grace after it for a step that ignores the timeout's TERM: 450 + 4 x 5
# = 470 s at most, under 8 minutes. Each step's own limit sits inside its budget.
B_ENV=25 B_TESTS=145 B_GRAPHS=260 B_SUMMARY=20 KILL_S=5
DRY_ARGS=()
GRAPHS_ARGS=(--budget-s $((B_GRAPHS - 60)))
if [ "$DRY" = 1 ]; then
    DRY_ARGS=(--dry-run)
    GRAPHS_ARGS+=(--device cpu --allow-cpu --batches 1 --ratios 1.0 --gen-length 32 --prompt-length 20 --layers 3)
fi
FAILED=0

# step INDEX NAME BUDGET COMMAND...: run it under timeout, then write OUT/NAME_gpu_run.STEP.json (tmp + mv).
step() {
    local i="$1" name="$2" budget="$3"; shift 3
    echo "== step $i/4 $name: budget $budget s"
    local t0 t1 rc timed_out=false
    t0=$(date +%s.%N)
    timeout -k "$KILL_S" "$budget" "$@"
    rc=$?
    t1=$(date +%s.%N)
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then timed_out=true; FAILED=1; elif [ "$rc" != 0 ]; then FAILED=1; fi
    local secs file="$OUT/${NAME}_gpu_run.$name.json"
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    printf '{"step": "%s", "budget_s": %s, "rc": %s, "timed_out": %s, "seconds": %s, "python": "%s"}\n' \
        "$name" "$budget" "$rc" "$timed_out" "$secs" "$PY" > "$file.tmp" && mv "$file.tmp" "$file"
    echo "== step $i/4 $name: exit $rc in $secs s (timed out: $timed_out) -> $file"
    return "$rc"
}

echo "gpu_run: python $PY, reports under $OUT (prefix ${NAME}_), 4 steps, $((B_ENV + B_TESTS + B_GRAPHS + B_SUMMARY)) s of budgets"
step 1 environment "$B_ENV" "$PY" scripts/gpu_run.py environment --out "$OUT" --name "$NAME" ${DRY_ARGS[@]+"${DRY_ARGS[@]}"}
rc=$?
if [ "$rc" = 3 ]; then exit 3; fi
step 2 cuda_tests "$B_TESTS" "$PY" scripts/gpu_tests.py --out "$OUT" --name "$NAME" --timeout $((B_TESTS - 10))
step 3 graphs "$B_GRAPHS" "$PY" scripts/gpu_check_graphs.py --out "$OUT/${NAME}_graphs.json" "${GRAPHS_ARGS[@]}"
step 4 summary "$B_SUMMARY" "$PY" scripts/gpu_run.py summary --out "$OUT" --name "$NAME" ${DRY_ARGS[@]+"${DRY_ARGS[@]}"}
exit "$FAILED"
