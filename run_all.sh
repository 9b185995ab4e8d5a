#!/usr/bin/env bash
# Run every notebook for one profile with papermill and print the verdict of each claim.
#   ./run_all.sh              the cpu profile (tiny checkpoint, emulated link; minutes on 2 cores)
#   ./run_all.sh h200 --model /path/to/LLaDA2.0-mini     a GPU profile on a real checkpoint
#   ./run_all.sh cpu --force  re-run notebooks whose executed copies are already complete
#   ./run_all.sh h200 --model DIR --submit slurm [--shards N]
#                             first the heavy stages (traces, bench grids) as jobs (python -m artifact
#                             run-jobs), waited for and merged; then the notebooks, which find them complete
# Executed notebooks go to results/<profile>/, figures to figures/<profile>/, data to data/results/<profile>/.
# The exit code is the number of notebooks that failed (or the jobs' exit code when a stage failed).
set -euo pipefail
cd "$(dirname "$0")"
source scripts/env.sh
# Arguments are checked here, before anything runs: a refusal is one line on stderr and exit 2 (never the
# shell's own error), as `python -m artifact` refuses its bad arguments.
refuse() { echo "error: run_all.sh: $*" >&2; exit 2; }
profile="${1:-cpu}"
[ $# -gt 0 ] && shift
case "$profile" in -*) refuse "the first argument is the profile (e.g. cpu, h200), not the flag $profile" ;; esac
jobs=()          # run-jobs arguments: --submit, --shards, and the profile's --model/--set
notebooks=()     # notebooks arguments: everything but --submit and --shards
shards=""
submit=""
# value FLAG [VALUE...]: the value that follows FLAG, refused when it is missing or is another flag.
value() {
  [ $# -ge 2 ] && [ -n "$2" ] && [ "${2#--}" = "$2" ] || refuse "$1 needs a value"
  printf '%s' "$2"
}
while [ $# -gt 0 ]; do
  case "$1" in
    --submit) submit="$(value "$@")"; jobs+=("$1" "$submit"); shift 2 ;;
    --shards)
      shards="$(value "$@")"
      [[ "$shards" =~ ^[1-9][0-9]{0,3}$ ]] || refuse "--shards $shards: expected a whole number 1-9999"
      jobs+=("$1" "$shards"); shift 2 ;;
    --model|--set) v="$(value "$@")"; jobs+=("$1" "$v"); notebooks+=("$1" "$v"); shift 2 ;;
    --quiet) jobs+=("$1"); notebooks+=("$1"); shift ;;
    *) notebooks+=("$1"); shift ;;
  esac
done
[ -z "$shards" ] || [ -n "$submit" ] || refuse "--shards needs --submit (slurm or local): shards are jobs"
# The preflight first: device and host memory, disk and the grid's size, from the config and the safetensors
# headers only (python -m artifact doctor); a run that cannot fit stops here, with the line that says why.
doctor=()
for ((i = 0; i < ${#notebooks[@]}; i++)); do
  case "${notebooks[$i]}" in --model|--set) doctor+=("${notebooks[$i]}" "${notebooks[$((i + 1))]}"); i=$((i + 1)) ;; esac
done
"$PY" -m artifact doctor --profile "$profile" "${doctor[@]}"
if [ -n "$submit" ]; then
  "$PY" -m artifact run-jobs --profile "$profile" "${jobs[@]}"
fi
exec "$PY" -m artifact notebooks --profile "$profile" "${notebooks[@]}"
