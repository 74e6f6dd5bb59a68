"""The optimiser's budget of an attack, one settings object shared by the attacks that optimise.

:class:`AttackBudget` holds what a reader compares between papers: how many iterations, at what step size,
from how many random starts, with how much L-BFGS memory and (DLG's reference code) in how many calls of the
optimiser. Each attack keeps its paper's values as a module constant (``gradient_inversion.DLG_BUDGET``,
``gradient_inversion.IG_BUDGET``) and takes ``budget=`` in place of the separate arguments.
"""
from __future__ import annotations

from dataclasses import dataclass

from .._checks import finite_positive, whole_int

__all__ = ["AttackBudget"]


@dataclass(frozen=True)
class AttackBudget:
    """An attack optimiser's budget (frozen; compare, print and reuse it).

    * ``max_iter``: iterations of the optimiser (L-BFGS for DLG, Adam for Inverting Gradients); with ``steps``,
      the iterations of each call.
    * ``lr``: the step size (DLG: the fixed L-BFGS step, ``1.0`` in Zhu et al.'s code; Inverting Gradients:
      Adam's rate, ``0.1`` in Geiping et al., Sec. 4).
    * ``num_restarts``: independent random starts, the best kept (Geiping et al. 2020, Sec. 4); default ``1``.
    * ``history_size``: the L-BFGS memory (pairs kept), ``100`` as ``torch.optim.LBFGS``'s default that
      Zhu et al.'s code uses; not used by an Adam attack.
    * ``steps``: ``None`` (default), one run of ``max_iter`` iterations; ``S``: DLG's reference loop, ``S``
      calls of ``torch.optim.LBFGS(max_iter=max_iter).step`` (Zhu et al.'s code: ``S = 300``, ``max_iter = 20``).

    Raises ``ValueError`` naming the field for a ``max_iter``, ``num_restarts``, ``history_size`` or ``steps``
    that is not a whole number ``>= 1`` (``steps`` may be ``None``) or an ``lr`` that is not finite and ``> 0``.
    """

    max_iter: int
    lr: float
    num_restarts: int = 1
    history_size: int = 100
    steps: int | None = None

    def __post_init__(self):
        for name in ("max_iter", "num_restarts", "history_size") + (("steps",) if self.steps is not None else ()):
            object.__setattr__(self, name, whole_int(f"AttackBudget.{name}", getattr(self, name), low=1))
        finite_positive("AttackBudget.lr", self.lr)          # checked, kept as given
