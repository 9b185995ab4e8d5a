#!/usr/bin/env bash
# How stable are a profile's timing verdicts? Run the timing notebooks (03-07) N times, each from scratch in
# its own temporary data and output folders (fresh bench grids; routing traces copied when present), store
# each run's claim records under data/results/<profile>/agreement/runK/ and print the agreement table
# (python -m artifact claims --agreement; `--update-readme` puts the stored runs' table into docs/claims.md).
#   scripts/verdict_agreement.sh [PROFILE] [RUNS]      default: cpu 3
# A run directory that exists is never overwritten: remove data/results/<profile>/agreement/ to start over.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
profile="${1:-cpu}"
runs="${2:-3}"
base="data/results/$profile/agreement"
mkdir -p "$base"
for _ in $(seq 1 "$runs"); do
  k=1
  while [ -e "$base/run$k" ]; do k=$((k + 1)); done
  tmp="$(mktemp -d)"
  mkdir -p "$tmp/data/traces"
  ln -s "$PWD/data/tasks" "$tmp/data/tasks"
  if [ -d "data/traces/$profile" ]; then cp -r "data/traces/$profile" "$tmp/data/traces/"; fi
  echo "[agreement] run $k of $profile in $tmp"
  ARTIFACT_DATA="$tmp/data" ARTIFACT_OUTPUT="$tmp/results" \
    "$PY" -m artifact notebooks --profile "$profile" --only 03,04,05,06,07 --force --quiet
  mkdir -p "$base/.run$k.partial"
  cp "$tmp/results/$profile/data/"*.claims.json "$base/.run$k.partial/"
  mv "$base/.run$k.partial" "$base/run$k"          # whole runs only
  rm -rf "$tmp"
done
"$PY" -m artifact claims --profile "$profile" --agreement
