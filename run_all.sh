#!/usr/bin/env bash
# Run every notebook for one profile with papermill and print the verdict of each claim.
#   ./run_all.sh              the cpu profile (tiny checkpoint, emulated link; minutes on 2 cores)
#   ./run_all.sh h200 --model /path/to/LLaDA2.0-mini     a GPU profile on a real checkpoint
#   ./run_all.sh cpu --force  re-run notebooks whose executed copies are already complete
# Executed notebooks go to results/<profile>/, figures to figures/<profile>/, data to data/results/<profile>/.
# The exit code is the number of notebooks that failed.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/env.sh
profile="${1:-cpu}"
[ $# -gt 0 ] && shift
exec "$PY" -m artifact notebooks --profile "$profile" "$@"
