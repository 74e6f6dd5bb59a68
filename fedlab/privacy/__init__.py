"""Defenses: update perturbation and pruning, DP mechanisms and privacy accounting.

Modules: :mod:`fedlab.privacy.defenses` (noise, pruning), :mod:`fedlab.privacy.clipping` (clipping and the
overflow-safe L2 norm). Chapter-specific mechanisms
live in their own modules here (one per concept).
"""
from .clipping import clip_by_norm
from .defenses import gaussian_noise, global_norm, prune_by_magnitude

__all__ = ["gaussian_noise", "prune_by_magnitude", "clip_by_norm", "global_norm"]
