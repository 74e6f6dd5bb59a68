"""fedlab: the implementations behind the course "Privacy attacks and defenses in federated learning".

Layered by concept (imports run from the bottom of this list to the top, never back)::

    fedlab.experiments  one module per chapter: the sweeps, tables and figures it runs
    fedlab.attacks      by what is inferred: gradient_inversion, embedding_leakage, membership,
                        identifiability, interaction_inference, model_reconstruction
    fedlab.fl           the round loop (fl.rounds) and the protocols: FedAvg / FedSGD / DSSGD,
                        DP-FedAvg, Centaur, IFCA, recsys, OLTR
    fedlab.privacy      mechanisms (clip, prune, Gaussian, Euclidean Laplace), accounting, secure aggregation
    fedlab.data         data sets by kind, client partitioners, checksummed downloads
    fedlab.models       small models, losses and parameter-vector helpers
    fedlab.metrics      accuracy, ROC AUC, MSE / PSNR
    fedlab.optim        the batched per-row L-BFGS
    fedlab.config       scale switch, seeding, progress bars, data cache
    fedlab.book         page helpers (setup, glue_many); fedlab.records, fedlab.reproduce: the records

Note: the PyPI name ``fedlab`` belongs to an unrelated project; this package is distributed as
``fedlab-privacy-course`` and imported as ``fedlab``.
"""
from .config import data_dir, default_seed, is_paper_scale, pick, progress_enabled, rng, scale, seed_everything

__version__ = "0.1.0"

__all__ = ["scale", "is_paper_scale", "pick", "default_seed", "seed_everything", "rng", "data_dir",
           "progress_enabled", "__version__"]
