"""fedlab: the implementations behind the course "Privacy attacks and defenses in federated learning".

Layered by concept::

    fedlab.config    scale switch, seeding, device, data cache
    fedlab.data      data sets, client partitioners, checksummed downloads
    fedlab.models    small models and parameter-vector helpers
    fedlab.fl        FedAvg / FedSGD / selective SGD, functional client updates
    fedlab.attacks   attacks on FL (one module per chapter topic)
    fedlab.privacy   defenses: noise, pruning, DP mechanisms and accounting
    fedlab.metrics   accuracy, ROC AUC, MSE / PSNR
    fedlab.plots     one plotting style for the whole book

Note: the PyPI name ``fedlab`` belongs to an unrelated project; this package is distributed as
``fedlab-privacy-course`` and imported as ``fedlab``.
"""
from .config import data_dir, default_seed, device, is_paper_scale, pick, progress_enabled, rng, scale, seed_everything

__version__ = "0.1.0"

__all__ = ["scale", "is_paper_scale", "pick", "default_seed", "seed_everything", "rng", "device", "data_dir",
           "progress_enabled", "__version__"]
