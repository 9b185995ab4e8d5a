# Sourced by run_tests.sh and run_all.sh: create or reuse .venv and install what is missing.
# A second call finds the install stamp (a hash of pyproject.toml and requirements.lock, and whether the lock
# applied) and returns in well under a second.
#   ARTIFACT_VENV   where the environment lives (default: <repo>/.venv; a conda environment: "$CONDA_PREFIX")
#   ARTIFACT_TORCH  the torch requirement to install when torch is missing (default: torch==2.13.0;
#                   on a GPU machine set it to the CUDA build you want, e.g. "torch==2.13.0" from the CUDA index;
#                   a torch other than 2.13.0 needs ARTIFACT_LOCK=0, since the lock pins torch==2.13.0)
#   ARTIFACT_LOCK   1 (default): install with requirements.lock as pip constraints, the exact versions the
#                   stored runs used (Python 3.11 only: under another Python it installs without, and says so);
#                   0: without it, at the newest versions pyproject.toml's ranges allow
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${ARTIFACT_LOCK:-1}" in
  0 | 1) ;;
  *) echo "error: ARTIFACT_LOCK=${ARTIFACT_LOCK}: expected 1 (install with requirements.lock, the default) or 0 (without it)" >&2
     return 2 2>/dev/null || exit 2 ;;
esac
# ARTIFACT_TORCH: one pip requirement for torch (a version, specifiers, a local build tag or a URL), checked
# before anything is created or installed: pip would say so only later, in several lines.
if [ -n "${ARTIFACT_TORCH:-}" ]; then
  _v='[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?'      # a version (PEP 440)
  _v+='(\+[A-Za-z0-9]+(\.[A-Za-z0-9]+)*)?(\.\*)?'                           # a local tag (+cu126), a .*
  _op="(===?|!=|<=|>=|~=|<|>) *$_v"
  _req="^torch *(\[[A-Za-z0-9_, -]*\])? *(($_op)( *, *$_op)*|@ *[^ ]+)?$"
  if ! [[ "$ARTIFACT_TORCH" =~ $_req ]]; then
    echo "error: ARTIFACT_TORCH='${ARTIFACT_TORCH}': expected one pip requirement for torch," \
      "e.g. torch==2.13.0, torch==2.13.0+cu126 or 'torch @ URL'" >&2
    return 2 2>/dev/null || exit 2
  fi
fi
VENV="${ARTIFACT_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
# An install step that fails stops here, before the install stamp is written: the next call installs again.
if [ ! -x "$PY" ]; then
  echo "[env] creating $VENV"
  if ! "${PYTHON:-python3}" -m venv "$VENV"; then
    echo "error: [env] could not create the environment $VENV (${PYTHON:-python3} -m venv)" >&2
    return 1 2>/dev/null || exit 1
  fi
fi
_lock=()
if [ "${ARTIFACT_LOCK:-1}" != 0 ]; then
  _lock_py="$(sed -n 's/^# python: //p' "$ROOT/requirements.lock")"
  if [ "$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$_lock_py" ]; then
    _lock=(-c "$ROOT/requirements.lock")
  else
    echo "[env] requirements.lock is for Python $_lock_py; installing without it (pyproject.toml's ranges)"
  fi
fi
_want="$(cat "$ROOT/pyproject.toml" "$ROOT/requirements.lock" | sha256sum | cut -c1-12)-${#_lock[@]}"
_stamp="$VENV/.artifact-installed"
if [ "$(cat "$_stamp" 2>/dev/null)" != "$_want" ]; then
  echo "[env] installing the project into $VENV (first run takes a few minutes)"
  if ! "$PY" -m pip install -q --disable-pip-version-check --upgrade pip; then
    echo "error: [env] upgrading pip in $VENV failed (pip's message above); not marked installed" >&2
    return 1 2>/dev/null || exit 1
  fi
  if [ ${#_lock[@]} -gt 0 ]; then   # a lock out of date with pyproject.toml: one sentence, not pip's resolver
    "$PY" "$ROOT/scripts/check_lock.py" || return 2 2>/dev/null || exit 2
  fi
  if ! "$PY" -c "import torch" 2>/dev/null; then
    if ! "$PY" -m pip install -q --disable-pip-version-check "${ARTIFACT_TORCH:-torch==2.13.0}"; then
      echo "error: [env] installing ${ARTIFACT_TORCH:-torch==2.13.0} into $VENV failed (pip's message" \
        "above); not marked installed: set ARTIFACT_TORCH to a torch this machine can install" >&2
      return 1 2>/dev/null || exit 1
    fi
  fi
  if ! "$PY" -m pip install -q --disable-pip-version-check ${_lock[@]+"${_lock[@]}"} -e "$ROOT[dev]"; then
    echo "error: [env] installing the project into $VENV failed (pip's message above);" \
      "not marked installed" >&2
    return 1 2>/dev/null || exit 1
  fi
  echo "$_want" > "$_stamp"
fi
# The notebooks' kernel, registered inside the venv (committed notebooks name it, never a machine path):
# `.venv/bin/jupyter lab` lists it as "artifact (.venv)"; papermill and nbval start it by name.
if [ ! -f "$VENV/share/jupyter/kernels/artifact/kernel.json" ]; then
  "$PY" -m ipykernel install --sys-prefix --name artifact --display-name "artifact (.venv)" >/dev/null
fi
export PYTHONHASHSEED=0
export ARTIFACT_CACHE="${ARTIFACT_CACHE:-$ROOT/.cache}"
