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
def _check_no_other_fedlab() -> None:
    """Fail at import if SMILELab's FedLab (PyPI distribution ``fedlab``) is installed in this
    environment: both install a top-level ``fedlab`` package, so their files overwrite each other
    silently and neither works. One metadata lookup, no scan of the environment."""
    from importlib import metadata

    try:
        other = metadata.distribution("fedlab")
    except metadata.PackageNotFoundError:
        return
    raise ImportError(
        f"The distribution 'fedlab' {other.version} (SMILELab's FedLab, an unrelated project) is installed in "
        f"this environment and also provides the import name 'fedlab'; the two overwrite each other's files. "
        f"Use a separate virtual environment for this course's package (distribution 'fedlab-privacy-course'), "
        f"or `pip uninstall fedlab fedlab-privacy-course` and reinstall this one.")


_check_no_other_fedlab()

from .config import data_dir, default_seed, device, is_paper_scale, pick, progress_enabled, rng, scale, seed_everything  # noqa: E402,E501

__version__ = "0.1.0"

__all__ = ["scale", "is_paper_scale", "pick", "default_seed", "seed_everything", "rng", "data_dir",
           "progress_enabled", "device", "__version__"]
