#!/usr/bin/env bash
# One prepared GPU run, no checkpoint, nothing downloaded or installed; by default at most 5 minutes of budgets
# (295 s, grace included), so that a borrowed machine's 15 minutes leave time for a second try:
#   1. environment  python, torch, CUDA, the GPU (its name checked), which packages import  (scripts/gpu_run.py)
#   2. graphs       the graphs check, forward eager vs segmented, T1-T7, first on a fresh GPU (gpu_check_graphs.py)
#   3. cuda_tests   the CUDA tests of the new path (segmented forward, batched copy); --full: all (gpu_tests.py)
#   4. summary      each step's result, T1-T7 with their verdicts, one archive, the reports to commit (gpu_run.py)
# Each step runs under `timeout` with its budget (printed), on whatever torch the machine has: the checkout's
# .venv ($ARTIFACT_VENV, as scripts/env.sh) where it was carried and imports torch, else the image's python3,
# with the checkout on PYTHONPATH.
# The reports are named after the GPU: its short name from nvidia-smi (h200, h100, a5000); a --name that is not
# the GPU's is refused (exit 2). Under --out, at most 8 files and no folder (what a borrowed GPU machine returns):
# NAME_gpu_run.steps.jsonl (one line per step, as it ends), NAME_gpu_run_environment.json, NAME_graphs.json
# (each row as it is measured), NAME_gpu_run_tests.json and .log, NAME_gpu_run_summary.json and
# NAME_gpu_run.tar.gz (all of them in one archive); temporary files of a killed atomic write are removed.
#
#   scripts/gpu_run.sh [--out DIR] [--name NAME] [--dry-run] [--full] [--budget-STEP S ...] [--show-budgets]
#     --out DIR        where the reports go (default results/gpu_run; --dry-run: results/gpu_run_dry: both
#                      ignored by git, so no run writes into the checkout's tracked folders; copy a real
#                      run's reports to data/gpu_check/ to commit them); on a borrowed machine give it an
#                      empty folder.
#                      A dry run refuses a DIR holding this name's files from a real run (it never writes over
#                      a measurement)
#     --name NAME      check that the GPU is NAME (default: nvidia-smi's name; --dry-run: cpu);
#                      DIR/h200_graphs.json is what the performance model reads (hardware.GPU_CHECK_GRAPHS)
#     --dry-run        the same steps on the CPU with tiny shapes: the CUDA tests skip with their reason and
#                      T1-T7 read unmeasured
#     --full           every CUDA test and the graphs check's whole grid (budgets 60/260/180/15 s: about 9 min)
#     --budget-environment S, --budget-graphs S, --budget-tests S, --budget-summary S
#                      a step's budget in seconds (default 60, 140, 60, 15; --full 60, 260, 180, 15)
#     --show-budgets   print the budgets these arguments give, and exit
# ARTIFACT_NO_MEMCPY_BATCH=1 in the environment turns the batched copy (cudaMemcpyBatchAsync) off: the CUDA
# link copies with its copy_ loop (an A/B run of the two paths).
# Exit codes: 0 every step ended in time (the verdicts are in the output); 1 a step failed or ran out of time;
# 2 bad arguments, or a --name that is not the GPU's; 3 no CUDA GPU visible (only the environment step ran).
# Each refusal (2, 3) is one line on stderr and comes before anything is written: --out is left as it was.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ARTIFACT_VENV:-$ROOT/.venv}"      # as scripts/env.sh
usage_error() { echo "gpu_run: $*" >&2; exit 2; }

# The arguments, checked by scripts/gpu_run.py (`args`) before anything is written: one line and exit 2 for a
# bad one; else shell assignments (OUT absolute, a relative --out the caller's; NAME; DRY, FULL, SHOW, HELP;
# the budgets B_ENV B_GRAPHS B_TESTS B_SUMMARY, KILL_S and TOTAL). Run from the caller's folder.
ARGS_PY="$VENV/bin/python"
[ -x "$ARGS_PY" ] || ARGS_PY="$(command -v python3 || command -v python)"
[ -n "$ARGS_PY" ] || usage_error "no python found (looked for $VENV/bin/python, python3, python)"
PARSED="$("$ARGS_PY" "$ROOT/scripts/gpu_run.py" args "$@")" || exit 2
OUT="" NAME="" DRY=0 FULL=0 SHOW=0 HELP=0 B_ENV="" B_GRAPHS="" B_TESTS="" B_SUMMARY="" KILL_S="" TOTAL=""
eval "$PARSED"
cd "$ROOT"
if [ "$HELP" = 1 ]; then
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0
fi
# Budgets in seconds, each with KILL_S of grace after it for a step that ignores the timeout's TERM. Default:
# 60 + 140 + 60 + 15 + 4 x 5 = 295 s, under 5 minutes. The environment's 60 s cover a cold `import torch` and
# CUDA's initialisation. Each step's own limit sits inside its budget. (Unmeasured on a GPU in this form.)
if [ "$SHOW" = 1 ]; then
    echo "gpu_run: budgets environment $B_ENV s, graphs $B_GRAPHS s, cuda_tests $B_TESTS s, summary $B_SUMMARY s," \
         "$KILL_S s of grace each: $TOTAL s"
    exit 0
fi

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
    PY="$VENV/bin/python"
else
    PY="$(command -v python3 || command -v python)"
fi

# The reports' name: the GPU's (nvidia-smi), a given --name refused where it is not; a dry run is named cpu.
if [ "$DRY" = 1 ]; then
    NAME="${NAME:-cpu}"
elif SMI="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)" && [ -n "$SMI" ]; then
    NAME="$(printf '%s\n' "$SMI" | "$PY" scripts/gpu_run.py card ${NAME:+--name "$NAME"})" || exit 2
else
    echo "gpu_run: nvidia-smi gave no GPU name; the reports are named ${NAME:-gpu}_* (the environment step checks" \
         "the name against torch's device name)"
    NAME="${NAME:-gpu}"
fi

export PYTHONPATH="$ROOT:$ROOT/scripts${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONHASHSEED=0
export ARTIFACT_CACHE="${ARTIFACT_CACHE:-$ROOT/.cache}"
STEPS_FILE="$OUT/${NAME}_gpu_run.steps.jsonl"

# Temporary files of atomic writes a kill left behind (artifact.paths: .FILE.XXXX.tmp; this script: FILE.tmp).
clean_tmp() { find "$OUT" -maxdepth 1 -type f \( -name ".${NAME}_*.tmp" -o -name "${NAME}_*.tmp" \) -delete; }
# A run starts writing only once the environment step let it go on (a GPU, the right name): until then --out
# is left as it was, a finished run's files included.
start_writing() {
    mkdir -p "$OUT" || usage_error "cannot create --out $OUT"
    clean_tmp
    rm -f "$STEPS_FILE"                 # a fresh run: its own step records only
}

DRY_ARGS=() TEST_ARGS=()
GRAPHS_ARGS=(--budget-s $((B_GRAPHS * 7 / 10)))     # the rest: the configuration in flight, T1-T7, the last write
if [ "$FULL" = 1 ]; then
    TEST_ARGS=(--full)
else
    GRAPHS_ARGS+=(--ratios 1.0,1.73 --layers 4)      # what T1-T7 read first; 0.83 and 6 layers in --full
fi
if [ "$DRY" = 1 ]; then
    DRY_ARGS=(--dry-run)
    GRAPHS_ARGS+=(--device cpu --allow-cpu --batches 1 --ratios 1.0 --gen-length 32 --prompt-length 20 --layers 3)
fi
FAILED=0

# step INDEX NAME BUDGET COMMAND...: run it under timeout, then add its line to STEPS_FILE (tmp + mv).
step() {
    local i="$1" name="$2" budget="$3"; shift 3
    echo "== step $i/4 $name: budget $budget s"
    local t0 t1 rc timed_out=false secs
    t0=$(date +%s.%N)
    timeout -k "$KILL_S" "$budget" "$@"
    rc=$?
    t1=$(date +%s.%N)
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then timed_out=true; FAILED=1; elif [ "$rc" != 0 ]; then FAILED=1; fi
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    if [ "$i" = 1 ] && { [ "$rc" = 2 ] || [ "$rc" = 3 ]; }; then
        echo "== step 1/4 $name: exit $rc in $secs s: refused, nothing written under $OUT"
        return "$rc"
    fi
    [ "$i" = 1 ] && start_writing
    { cat "$STEPS_FILE" 2>/dev/null
      printf '{"step": "%s", "budget_s": %s, "rc": %s, "timed_out": %s, "seconds": %s, "python": "%s"}\n' \
          "$name" "$budget" "$rc" "$timed_out" "$secs" "$PY"; } > "$STEPS_FILE.tmp" && mv "$STEPS_FILE.tmp" "$STEPS_FILE"
    echo "== step $i/4 $name: exit $rc in $secs s (timed out: $timed_out) -> $STEPS_FILE"
    return "$rc"
}

echo "gpu_run: python $PY, reports under $OUT (prefix ${NAME}_), 4 steps ($([ "$FULL" = 1 ] && echo full || echo \
the new path)), $TOTAL s of budgets with grace"
step 1 environment "$B_ENV" "$PY" scripts/gpu_run.py environment --out "$OUT" --name "$NAME" ${DRY_ARGS[@]+"${DRY_ARGS[@]}"}
rc=$?
if [ "$rc" = 2 ] || [ "$rc" = 3 ]; then exit "$rc"; fi
step 2 graphs "$B_GRAPHS" "$PY" scripts/gpu_check_graphs.py --out "$OUT/${NAME}_graphs.json" "${GRAPHS_ARGS[@]}"
step 3 cuda_tests "$B_TESTS" "$PY" scripts/gpu_tests.py --out "$OUT" --name "$NAME" --timeout $((B_TESTS > 20 ? B_TESTS - 10 : B_TESTS)) \
    ${TEST_ARGS[@]+"${TEST_ARGS[@]}"}
step 4 summary "$B_SUMMARY" "$PY" scripts/gpu_run.py summary --out "$OUT" --name "$NAME" ${DRY_ARGS[@]+"${DRY_ARGS[@]}"}
clean_tmp
echo "gpu_run: $(find "$OUT" -mindepth 1 -maxdepth 1 -name "${NAME}_*" | wc -l) files of this run under $OUT"
exit "$FAILED"
