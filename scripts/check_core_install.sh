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
OMP_NUM_THREADS=1 FEDLAB_PROGRESS=0 "$VENV/bin/python" - <<'PY'
import importlib.util, math
for absent in ("IPython", "myst_nb", "jupyter_book", "pytest"):
    assert importlib.util.find_spec(absent) is None, f"{absent} was installed by `pip install .`"
import fedlab, torch
assert "site-packages" in fedlab.__file__, fedlab.__file__
from fedlab import data, fl, models, plots
from fedlab.privacy import dp_fedavg, ldp
s = ldp.gaussian_sigma(10, 1e-8, 1)
eps = dp_fedavg.epsilon_spent(1.0, 0.1, 100, 1e-5)
assert math.isfinite(s) and s > 0 and math.isfinite(eps) and eps > 0, (s, eps)
d = data.load_digits()
parts = data.partition_iid(len(d.y), 4, seed=0)
clients = fl.stack_clients([(d.X[p], d.y[p]) for p in parts])
model = models.mlp(64, [32], 10, seed=0)
res = fl.fedavg(model, clients, num_rounds=1, lr=0.1, eval_data=(d.X, d.y), progress=False)
acc = res.history.last["accuracy"]
assert 0.1 < acc <= 1.0, acc
print(f"core install OK: fedlab {fedlab.__file__}; gaussian_sigma(10, 1e-8, 1) = {s:.4f}; "
      f"epsilon_spent = {eps:.3f}; one FedAvg round, accuracy {acc:.3f}; plots.md_table without IPython: {len(plots.md_table(['a'], [[1]]))} characters")
PY
