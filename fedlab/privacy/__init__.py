"""Defenses: update perturbation and pruning, DP mechanisms and privacy accounting.

Modules: :mod:`fedlab.privacy.defenses` (noise, pruning), :mod:`fedlab.privacy.clipping` (clipping and the
overflow-safe L2 norm), :mod:`fedlab.privacy.registry` (every defense of the book behind one call,
:func:`apply`). Chapter-specific mechanisms live in their own modules here (one per concept).
"""
from .clipping import clip_by_norm
from .defenses import gaussian_noise, global_norm, prune_by_magnitude
from .registry import DEFENSES, Defense, apply, apply_public

__all__ = ["gaussian_noise", "prune_by_magnitude", "clip_by_norm", "global_norm", "Defense", "DEFENSES", "apply",
           "apply_public"]
