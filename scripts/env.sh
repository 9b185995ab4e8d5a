# Sourced by run_tests.sh and run_all.sh: create or reuse .venv and install what is missing.
# A second call finds the install stamp (hash of pyproject.toml) and returns in well under a second.
#   ARTIFACT_VENV   where the environment lives (default: <repo>/.venv)
#   ARTIFACT_TORCH  the torch requirement to install when torch is missing (default: torch==2.13.0;
#                   on a GPU machine set it to the CUDA build you want, e.g. "torch==2.13.0" from the CUDA index)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ARTIFACT_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
if [ ! -x "$PY" ]; then
  echo "[env] creating $VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
fi
_want="$(cat "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)"
_stamp="$VENV/.artifact-installed"
if [ "$(cat "$_stamp" 2>/dev/null)" != "$_want" ]; then
  echo "[env] installing the project into $VENV (first run takes a few minutes)"
  "$PY" -m pip install -q --disable-pip-version-check --upgrade pip
  if ! "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m pip install -q --disable-pip-version-check "${ARTIFACT_TORCH:-torch==2.13.0}"
  fi
  "$PY" -m pip install -q --disable-pip-version-check -e "$ROOT[dev]"
  echo "$_want" > "$_stamp"
fi
# The notebooks' kernel, registered inside the venv (committed notebooks name it, never a machine path):
# `.venv/bin/jupyter lab` lists it as "artifact (.venv)"; papermill and nbval start it by name.
if [ ! -f "$VENV/share/jupyter/kernels/artifact/kernel.json" ]; then
  "$PY" -m ipykernel install --sys-prefix --name artifact --display-name "artifact (.venv)" >/dev/null
fi
export PYTHONHASHSEED=0
export ARTIFACT_CACHE="${ARTIFACT_CACHE:-$ROOT/.cache}"
