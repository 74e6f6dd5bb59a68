"""The library calls a core install (``pip install .``, no extras) must run: scripts/check_core_install.sh runs
this in a fresh virtual environment with ``--installed`` (which also checks that no notebook-stack package
was installed and that the installed copy is the one imported); tests/test_scripts.py runs it in the
development environment without the flag, so that an API change that breaks it fails ``make test``, not
only CI."""
import argparse
import importlib.util
import math

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--installed", action="store_true",
                    help="also check the install itself: no IPython/myst-nb/jupyter-book/pytest, fedlab from site-packages")
args = parser.parse_args()
if args.installed:
    for absent in ("IPython", "myst_nb", "jupyter_book", "pytest"):
        assert importlib.util.find_spec(absent) is None, f"{absent} was installed by `pip install .`"

import fedlab  # noqa: E402
from fedlab import data, fl, models, plots  # noqa: E402
from fedlab.privacy import dp_fedavg, ldp  # noqa: E402

if args.installed:
    assert "site-packages" in fedlab.__file__, fedlab.__file__
s = ldp.gaussian_sigma(10, 1e-8, 1)
eps = dp_fedavg.epsilon_spent(1.0, 0.1, 100, 1e-5)
assert math.isfinite(s) and s > 0 and math.isfinite(eps) and eps > 0, (s, eps)
d = data.load_digits()
parts = data.partition_iid(len(d.y), 4, seed=0)
clients = fl.stack_clients([(d.X[p], d.y[p]) for p in parts])
model = models.mlp(64, [32], 10, seed=0)
res = fl.fedavg(model, clients, num_rounds=1, local=fl.LocalTraining(lr=0.1), eval_data=(d.X, d.y))
acc = res.history.last["accuracy"]
assert 0.1 < acc <= 1.0, acc
print(f"core install OK: fedlab {fedlab.__file__}; gaussian_sigma(10, 1e-8, 1) = {s:.4f}; "
      f"epsilon_spent = {eps:.3f}; one FedAvg round, accuracy {acc:.3f}; plots.md_table without IPython: "
      f"{len(plots.md_table(['a'], [[1]]))} characters")
