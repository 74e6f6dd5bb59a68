"""Attacks on federated learning, one module per chapter topic (import the module you need).

:class:`AttackBudget` (``fedlab.attacks.budget``), the optimiser budget the attacks share, is exported here.
"""
from .budget import AttackBudget

__all__ = ["AttackBudget"]
