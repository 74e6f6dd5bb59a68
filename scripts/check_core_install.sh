#!/usr/bin/env bash
# The README's claim "pip install . alone gives a working library" (issue 22, item 1), checked as a user
# would: a fresh virtual environment, the CPU torch wheel, then `pip install .` with no extras. The
# library calls that once needed the notebook stack or an extra must work, and neither IPython nor
# myst-nb may have been installed.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="$(mktemp -d)/venv"
trap 'rm -rf "$(dirname "$VENV")"' EXIT
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
# from a copy of the tree (tracked and new, not ignored files): pip builds in the source folder, and CI runs
# this beside `make venv`, whose editable install writes the same build files into the tree
SRC="$(dirname "$VENV")/src"
mkdir -p "$SRC"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
   | tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$SRC"
"$VENV/bin/python" -m pip install --quiet "$SRC"
cd "$(dirname "$VENV")"            # not the source tree: the installed package must be the one imported
OMP_NUM_THREADS=1 FEDLAB_PROGRESS=0 "$VENV/bin/python" "$SRC/scripts/core_smoke.py" --installed
