"""The matrix's layout: what a row is (:class:`Attack`), who attacks in it (:data:`OBSERVERS`), the names of a
record's cells (:func:`value_name`, :data:`NAIVE_SUFFIX`, :data:`LOSS_SUFFIX`) and the column lookup the rows share
(the library's defenses of :mod:`fedlab.privacy.registry` and the user defenses of the :func:`run_row` call in
progress). The threat model of every cell is in :mod:`fedlab.experiments.matrix.rows`' docstring."""
from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
import torch

from ...config import pick
from ...privacy.registry import DEFENSES, Defense

__all__ = ["Attack", "OBSERVERS", "OUTSIDER", "UNIT", "NONNEG", "NAIVE_NOTE", "NAIVE_SUFFIX", "LOSS_SUFFIX",
           "LOSS_TRUTH_SUFFIX", "MALICIOUS_SERVER_DP_NA", "value_name"]

#: the library's columns by key (:data:`fedlab.privacy.registry.DEFENSES`)
_BY_KEY = {d.key: d for d in DEFENSES}


@dataclass(frozen=True)
class Attack:
    """A row: ``key``, ``label``, ``chapter`` (notebook stem it links to), ``metric`` (what a cell holds),
    ``higher_is_success`` (the direction in which the attack succeeds), ``threat`` (one sentence: who
    attacks and what it sees), ``run(seed, columns, tiny) -> {column key: value, "baseline": value}``,
    ``not_applicable`` (``{column key: reason}``, cells that do not exist), ``secagg_group`` (clients
    per secure sum), ``releases() -> (T, q)`` (how many releases of the target the attacker observes: ``T``
    rounds, the target sampled with probability ``q`` in each; read at record time, so at the record's
    scale) and ``cell_notes`` (``{column key: note}``, a cell computed differently from its column's
    threat model, shown as a footnote); ``observer`` (one of :data:`OBSERVERS`) is the one attacker of every
    cell of the row (a cell never mixes attackers); ``value_range`` ``(low, high)`` is the
    range of the metric (``-inf``/``inf`` for none), inside which the page's intervals stay."""

    key: str
    label: str
    chapter: str
    metric: str
    higher_is_success: bool
    threat: str
    run: Callable[..., dict]
    baseline: str
    not_applicable: Mapping[str, str] = field(default_factory=dict)
    secagg_group: int = 1
    releases: Callable[[], tuple[int, float]] = lambda: (1, 1.0)
    observer: str = "curious server"
    cell_notes: Mapping[str, str] = field(default_factory=dict)
    value_range: tuple[float, float] = (-math.inf, math.inf)

    def __post_init__(self):
        if self.observer not in OBSERVERS:
            raise ValueError(f"observer must be one of {list(OBSERVERS)}, got {self.observer!r}")
        lo, hi = self.value_range
        if not lo < hi:
            raise ValueError(f"value_range must be (low, high) with low < high, got {self.value_range}")

    @property
    def sees_central_noise(self) -> bool:
        """Whether the row's attacker sees the trusted server's DP noise: only an outsider does (the
        server that adds it and the eavesdropper on a client's link see the clipped update before it)."""
        return self.observer == OUTSIDER


#: who attacks in a row, and what it sees under central DP (one observer per row)
OBSERVERS = {
    "curious server": "the honest-but-curious server that aggregates: each client's message; under central DP the "
                      "clipped update before the noise it adds itself",
    "malicious server": "a server that deviates from the protocol; it would not add central DP's noise (n/a)",
    "eavesdropper": "a tap on one client's link: that client's messages; under central DP the clipped update (the "
                    "server adds the noise after the link)",
    "outsider": "sees only what the server releases, and knows every other client's update (the adversary of the DP "
                "guarantee): under central DP the target's clipped update plus the noise of the sum",
}
OUTSIDER = "outsider"
#: the range of a rate (AUC, share, accuracy) and of an error
UNIT, NONNEG = (0.0, 1.0), (0.0, math.inf)


#: the note of a cell that shows the naive attack under the adaptive one
NAIVE_NOTE = ("the cell is the attacker who knows the defense (DLG, Inverting Gradients and RAIFLE under pruning and "
              "top-k match only the coordinates that were sent; under clipping, and under central DP where the curious server sees the "
              "clipped gradient before its own noise, DLG clips its dummy gradient to the same C); 'naive' is the same attack "
              "ignoring the defense, which overstates the defense (DLG's and IG's dummy images start elsewhere in each column; RAIFLE's two attackers share their starts)")
#: suffix of a cell's value for the attack that ignores the defense, kept beside the adaptive attacker's:
#: ``"<row>|<column>@naive"`` in a record; the page prints it under the cell
NAIVE_SUFFIX = "@naive"
#: suffixes of the evidence that a mask-aware cell (DLG, IG, RAIFLE) reached its optimum: the median over the
#: targets of the attack's masked matching term (DLG's normalised L2 and IG's cosine,
#: :func:`fedlab.attacks.gradient_inversion.matching_loss`; RAIFLE's normalised matching loss) at the attack's answer
#: (``"<column>@loss"``) and at the truth (``"<column>@loss_truth"``: about 0 for DLG, IG and RAIFLE on FCF; for
#: RAIFLE on FPDGD above 0, since the server simulates the training in display order). A reached loss far above the
#: truth's means the optimiser stalled: the cell is then a lower bound on what leaks, not a measure of the defense;
#: one below it means the objective has better answers than the truth (:func:`~fedlab.experiments.matrix.stats.
#: optimum_verdict` says which)
LOSS_SUFFIX, LOSS_TRUTH_SUFFIX = "@loss", "@loss_truth"


def _size(tiny: bool, *, tiny_value, quick, paper):
    """``tiny_value`` for the unit tests' tiny run, else :func:`fedlab.pick` of ``quick`` / ``paper``."""
    return tiny_value if tiny else pick(quick=quick, paper=paper)


def _gens(seed: int, salt: int):
    return torch.Generator().manual_seed(1000 * int(seed) + salt), np.random.default_rng(1000 * int(seed) + salt)


#: the user defenses of the :func:`run_row` call in progress, ``{key: Defense}`` (the rows look their columns up
#: with :func:`_defense`, which sees the library's columns and these)
_USER: contextvars.ContextVar[Mapping[str, Defense]] = contextvars.ContextVar("fedlab_matrix_user_defenses", default={})


def _defense(key) -> Defense:
    """The :class:`Defense` of a column key (the library's, or a user defense of the current :func:`run_row`)."""
    d = _BY_KEY.get(key) or _USER.get().get(key) if isinstance(key, str) else key
    if not isinstance(d, Defense):
        raise ValueError(f"defense must be one of {list(_BY_KEY)} or a user Defense, got {key!r}")
    return d


#: central DP trusts the server to add the noise: against every malicious-server row its cells are n/a
MALICIOUS_SERVER_DP_NA = ("central DP trusts the server to add the noise; this attacker is a malicious server, "
                          "which would not (client-side noise, LDP or d-privacy, is the comparable cell)")


def value_name(row: str, column: str) -> str:
    """The record's name of a cell: ``"<row>|<column>"`` (``column`` may be ``"baseline"``)."""
    return f"{row}|{column}"
