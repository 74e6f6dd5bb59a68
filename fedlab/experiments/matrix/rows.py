"""The attack x defense matrix's rows and how they run: every attack of the book against every defense.

Rows are the chapters' attacks, columns the defenses of :mod:`fedlab.privacy`; each cell is the
attack's own success metric (the one its chapter reports) under that defense, at one seed, computed
from the chapters' functions (nothing is re-implemented here: the attacks come from
:mod:`fedlab.attacks`, the mechanisms from :mod:`fedlab.privacy` through its defense registry,
:func:`fedlab.privacy.apply`, the protocols from :mod:`fedlab.fl`).
``python -m fedlab reproduce matrix --seeds 0-2`` runs :func:`run_matrix` once per seed and stores the
record ``chapters/records/matrix.<scale>.json``; the book's page ``chapters/07_matrix.ipynb`` renders
it with :func:`fedlab.experiments.matrix.render.render_html`.

**One threat model per column** (:data:`fedlab.privacy.registry.DEFENSES`), the same for every row:

* ``none`` -- the attacker sees what its chapter lets it see (the server: each client's update; the
  eavesdropper: each message of the target);
* ``clip`` -- each client clips its update to L2 norm ``C`` (:func:`fedlab.privacy.clipping.clip_rows`),
  ``C`` the median norm of the clean updates of the round (the quantile adaptive clipping aims at);
* ``dp1`` / ``dp8`` -- DP-FedAvg (McMahan et al. 2018): updates clipped to ``C``, a *trusted* server adds
  ``N(0, (z C)^2)`` to their sum (:func:`fedlab.privacy.dp_fedavg.dp_aggregate`) with ``z`` calibrated by
  :func:`fedlab.privacy.dp_fedavg.noise_multiplier_for_epsilon` for client-level ``(eps, 1e-5)`` over a
  deployment of ``K = 1000`` clients, sampling rate ``q = 0.1``, ``T = 100`` rounds (the setting of
  Chapter 1c). What the attacker sees depends on where it stands (its row's :attr:`Attack.observer`, one
  per row): the honest-but-curious server that aggregates sees each client's *clipped
  update before the noise* (it adds the noise itself), so its cell is the clip-only view under the
  noisy training; the eavesdropper on a client's link sees the same clipped message (McMahan et al.'s
  Algorithm 1 clips on the client); an *outsider* (the rows of :data:`OUTSIDER_ROWS`, their own row
  group) sees the released noisy sum and knows every other client's update (the adversary the guarantee
  is stated against), i.e. the target's clipped update plus that noise. Against every *malicious*
  server (imprint, active membership, PAC, RAIFLE with ADM) central DP is n/a
  (:data:`MALICIOUS_SERVER_DP_NA`). ``z`` is calibrated for the deployment above; the epsilon that an
  outsider actually faces depends on how many releases it observes (:func:`effective_epsilons`, the
  privacy-loss-distribution accountant that also charges the ``ldp*`` columns);
* ``ldp1`` / ``ldp10`` / ``ldp500`` -- local DP (:func:`fedlab.privacy.ldp.ldp_gaussian`): each client
  clips to ``C`` and adds Gaussian noise for ``(eps, 1e-5)``-LDP, sensitivity ``2 C``, per release (it
  composes over the releases a row observes, charged by the same accountant as central DP);
* ``prune90`` -- each client zeroes the 90 % smallest coordinates (:func:`fedlab.privacy.defenses.prune_rows`);
  the zeros are visible in the update, so every row whose attack has a masked variant matches only the kept
  coordinates, the attacker who knows the defense: DLG and Inverting Gradients (``gradient_inversion.dlg`` and
  ``inverting_gradients`` with ``knows=Knowledge(mask=...)``), RAIFLE against FCF (``chapter3a.attack_case(coord_mask=...)``) and against
  FPDGD (``oltr.raifle_oltr(mask=...)``), each with the median loss it reached and the loss at the truth
  (:data:`LOSS_SUFFIX`); the attack that ignores the mask is kept beside it as ``"<row>|prune90@naive"``
  (:data:`NAIVE_SUFFIX`) and printed under the cell (under ``clip`` the DLG row's attacker likewise clips its
  dummy gradient to ``C``, ``Knowledge(clip_norm=C)``);
* ``dp1safe`` / ``ldp10safe`` -- the floating-point-safe mechanisms beside the float ones: the
  same epsilon, the discrete Gaussian on a public grid (``dp_aggregate(..., safe=True)``, ``ldp_gaussian(...,
  safe=True)``), each row's attacker and threat model as in the float column; their epsilons come from the
  discrete Gaussian's Renyi bound (:func:`safe_central_epsilon`, :func:`safe_ldp_epsilon`);
* ``topk1`` -- top-k sparsification at k = 1 % (``prune90`` is top-k at k = 10 %), with the same mask-aware
  attackers (the naive twins kept as ``"<row>|topk1@naive"``);
* ``secagg`` -- secure aggregation (:func:`fedlab.privacy.secure_aggregation.secure_sum`): the attacker
  sees only the sum over a group of clients (its size is given per row); in the row of the malicious server
  inside SecAgg+ (:data:`SECAGG_ROW`, its own row group) the cell runs Flower's SecAgg+ itself
  (:func:`fedlab.flower.run` with ``aggregation=flower.SecAgg()``), and ``secagg_cr`` is SecAgg+ with the consistency round;
* ``dpriv0.5`` / ``dpriv5`` -- d-privacy (Galli et al. 2022, Algorithm 2,
  :func:`fedlab.privacy.dprivacy.sanitize_update`): Euclidean Laplace noise with ``E ||rho|| = nu ||update||``
  (``nu = 5`` is Chapter 5's setting).

**A reader's own defense**: ``Defense(key, label, "user", fn=fn, public=(...))`` with ``fn``
of the contract :data:`USER_CONTRACT` (the clients' updates ``[A, n]`` and the row's generator in, what each
client sends out, optionally with public parameters from :data:`USER_PUBLIC`: a ``mask`` or a ``clip_norm``)
goes into :func:`run_row`'s ``columns`` beside the library's keys. Each client applies it to its own update
where the row applies a client-side defense; the row's attacker reads the public parameters where it has a
variant that uses them, else it is the naive attacker, and :func:`attacker` says which.

Each row (:data:`ATTACKS`) names its chapter, its metric and which direction means "the attack
succeeds", and a *no-information baseline* computed at every seed (the mean-colour image's PSNR, AUC
0.5, the error of the released global model, ...). The page colours a cell by the share of the
undefended attack's advantage over that baseline that survives the defense (:func:`advantage`); a row
whose undefended advantage is not significant over the record's seeds (:func:`undefended_advantage`)
is not coloured. A cell's interval is the 95 % Student-t interval over the seeds cut to its metric's
range (:func:`bounded_interval`).

This module holds :data:`ATTACKS` (the rows; each row's code is in a private module per chapter),
:func:`run_row`, :func:`cell`, :func:`attacker` and :func:`run_matrix`; the accounting is in
:mod:`fedlab.experiments.matrix.accounting`, the statistics in :mod:`fedlab.experiments.matrix.stats`, the
page's tables in :mod:`fedlab.experiments.matrix.render`.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Sequence

from ...config import pick
from ...privacy.registry import DEFENSES, Defense
from ._rows_gradient import _IMPRINT_NA, _dlg_row, _ig_row, _imprint_row
from ._rows_interaction import _oltr_adm, _oltr_plain, _pac_interactions, _pac_row, _rs_row
from ._rows_membership import _mia_active_row, _mia_row, _mia_rounds
from ._rows_reconstruction import _MR_FRACTION, _MR_GROUP, _MR_ROUNDS, _mr_row
from ._rows_secagg import (SECAGG_ATTACKS, SECAGG_CONSISTENT_SETTINGS, SECAGG_REFUSED_NOTE, SECAGG_ROW, _SA_CLIENTS,
                           _secagg_lie_row)
from .layout import _BY_KEY, _USER, NONNEG, OUTSIDER, UNIT, Attack, value_name

__all__ = ["ATTACKS", "OUTSIDER_ROWS", "OUTSIDER_COLUMNS", "OUTSIDER_SAME", "SECAGG_ROW", "SECAGG_ROWS",
           "SECAGG_ATTACKS", "SECAGG_COLUMNS", "SECAGG_CONSISTENT_SETTINGS", "SECAGG_REFUSED_NOTE", "run_row",
           "attacker", "cell", "run_matrix"]

#: the malicious-server rows' n/a cells: central DP trusts the server to add the noise
_MALICIOUS_NA = _IMPRINT_NA


#: the columns of an outsider row: the undefended reference and central DP, the one defense whose release differs
#: from each client's message (under a client-side defense an outsider who knows every other update sees the
#: target's message, which is the curious server's cell)
OUTSIDER_COLUMNS = ("none", "dp1", "dp1safe", "dp8")
OUTSIDER_SAME = ("not computed for the outsider: knowing every other client's update, it sees under this defense "
                 "the target's own message, the curious server's view (that row's cell, above)")


def _outsider(run: Callable[..., dict]) -> Callable[..., dict]:
    def row(seed: int, columns: Sequence[str], tiny: bool = False) -> dict:
        return run(seed, columns, tiny, outsider=True)
    return row


ATTACKS: tuple[Attack, ...] = (
    Attack("dlg", "DLG / iDLG (digits, one image per client)", "01a_gradient_leakage", "mean PSNR (dB)", True,
           "honest-but-curious server inverts each client's FedSGD gradient", _dlg_row,
           "PSNR of each digit's mean-colour image", secagg_group=4),
    Attack("ig", "Inverting Gradients (colour crops)", "01a_gradient_leakage", "mean PSNR (dB)", True,
           "honest-but-curious server inverts each client's gradient (cosine distance + TV prior)", _ig_row,
           "PSNR of each crop's mean-colour image", secagg_group=2),
    Attack("imprint", "Imprint (Robbing the Fed)", "01b_gradient_defenses", "share of digits recovered", True,
           "malicious server sends an imprinted model and reads inputs from the gradient", _imprint_row,
           "share of digits the pool's mean digit matches", not_applicable=_IMPRINT_NA, secagg_group=4,
           observer="malicious server", value_range=UNIT),
    Attack("mia", "Membership inference, passive server", "01c_membership_inference", "AUC", True,
           "honest-but-curious server scores members by their loss under the models it observes", _mia_row,
           "chance AUC", secagg_group=10, releases=lambda: (_mia_rounds(), 1.0), value_range=UNIT),
    Attack("mia_active", "Membership inference, active server (isolation + gradient ascent)",
           "01c_membership_inference", "AUC", True,
           "malicious server isolates the target and ascends the loss of the candidates before sending the model",
           _mia_active_row, "chance AUC", not_applicable=_MALICIOUS_NA, secagg_group=10,
           releases=lambda: (pick(quick=5, paper=10), 1.0), observer="malicious server", value_range=UNIT),
    Attack("pac", "PAC identifiability (Protocol 2)", "02_pac_identifiability", "sign accuracy", True,
           "malicious server sends a zero item model and estimates each user vector from the item deltas",
           _pac_row, "accuracy of always predicting 'dislike'", not_applicable=_MALICIOUS_NA, secagg_group=4,
           releases=lambda: (_pac_interactions(), 1.0), observer="malicious server", value_range=UNIT),
    Attack("rs", "RAIFLE, recommendation (FCF, embedding estimated)", "03a_raifle_recsys", "AUC", True,
           "curious server infers which items a user interacted with from its item-embedding update", _rs_row,
           "chance AUC", secagg_group=4, value_range=UNIT,
           cell_notes={"secagg": "an upper bound: the server attacks the group's sum restricted to the target's own "
                                 "item set, which it is given (an attacker without it would search the group's union)"}),
    Attack("oltr", "RAIFLE, online learning to rank", "03c_raifle_oltr", "AUC", True,
           "curious server infers a user's clicks from its ranker update", _oltr_plain, "chance AUC",
           secagg_group=4, value_range=UNIT),
    Attack("oltr_adm", "RAIFLE, online learning to rank + ADM", "03c_raifle_oltr", "AUC", True,
           "active server manipulates the documents' features (ADM) before inferring the clicks", _oltr_adm,
           "chance AUC", not_applicable=_MALICIOUS_NA, secagg_group=4, observer="malicious server",
           value_range=UNIT,
           cell_notes={"secagg": "a different experiment: RAIFLE's bypass (Chapter 3c's sa_bypass_experiment), one "
                                 "query per user, groups of 4, a fresh ranker per group, not the row's 8-query case"}),
    Attack("mr", "Local-model reconstruction (eavesdropper)", "04_model_reconstruction", "relative error", False,
           "eavesdropper on client 0's link decodes its local optimum from (sent, returned) model pairs", _mr_row,
           "relative error of the released global model", secagg_group=_MR_GROUP,
           releases=lambda: (_MR_ROUNDS, _MR_FRACTION), observer="eavesdropper", value_range=NONNEG),
)


def _outsider_row(a: Attack) -> Attack:
    """The outsider's twin of curious-server row ``a``: the same attack on the released noisy aggregate, all
    other updates known, in the columns :data:`OUTSIDER_COLUMNS` (the others would repeat ``a``'s cells)."""
    na = {d.key: OUTSIDER_SAME for d in DEFENSES if d.key not in OUTSIDER_COLUMNS}
    return Attack(f"{a.key}_outsider", f"{a.label}: outsider who sees the release", a.chapter, a.metric,
                  a.higher_is_success, f"outsider who sees the released aggregate and knows every other update "
                  f"runs the same attack ({_OUTSIDER_TASK[a.key]})", _outsider(a.run), a.baseline, not_applicable=na,
                  releases=a.releases, observer=OUTSIDER, value_range=a.value_range)


_OUTSIDER_TASK = {"dlg": "DLG on the target's gradient read off the release", "ig": "Inverting Gradients on the "
                  "target's gradient read off the release", "mia": "loss scores under the target's model read off "
                  "each release", "rs": "RAIFLE on the target's item update read off the release",
                  "oltr": "RAIFLE on the target's ranker update read off the release"}


#: the row group of the malicious server inside SecAgg+: every column but these is n/a in its row
SECAGG_COLUMNS = ("none", "secagg", "secagg_cr")
_SECAGG_ONLY = ("a column of the malicious-server-in-SecAgg+ row only: the consistency round guards against a server "
                "that lies inside the protocol; against this row's attacker it is secure aggregation (its column)")
_SECAGG_ROW_NA = ("this row attacks the secure-aggregation protocol itself (Flower's SecAgg+); the column's defense "
                  "is no secure aggregation, so the row has no such cell (the malicious server's attacks on the other "
                  "defenses are the imprint, active membership, PAC and ADM rows)")

SECAGG_ROWS: tuple[Attack, ...] = (
    Attack(SECAGG_ROW, "Malicious server inside SecAgg+ (false dropout, split view, model inconsistency)",
           "06b_flower_secagg",
           "PSNR (dB) of the target's digit", True,
           "malicious server lies inside Flower's SecAgg+ to unmask or isolate the target's model, then runs iDLG on it",
           _secagg_lie_row, "iDLG on the honest round's sum of 8 models (what SecAgg+ promises)",
           not_applicable={d.key: _SECAGG_ROW_NA for d in DEFENSES if d.key not in SECAGG_COLUMNS},
           secagg_group=_SA_CLIENTS, observer="malicious server",
           cell_notes={"secagg_cr": SECAGG_REFUSED_NOTE}),
)


#: the outsider row group: for every curious-server row that central DP applies to, the same
#: attack by an outsider who sees only the noisy release (the adversary DP-FedAvg's guarantee is stated against)
OUTSIDER_ROWS: tuple[Attack, ...] = tuple(_outsider_row(a) for a in ATTACKS if a.observer == "curious server")
ATTACKS = tuple(replace(a, not_applicable={**a.not_applicable, "secagg_cr": _SECAGG_ONLY})
                for a in ATTACKS + OUTSIDER_ROWS) + SECAGG_ROWS
_ATTACK_BY_KEY = {a.key: a for a in ATTACKS}


def _attack(row) -> Attack:
    a = _ATTACK_BY_KEY.get(row) if isinstance(row, str) else row
    if not isinstance(a, Attack):
        raise ValueError(f"row must be one of {list(_ATTACK_BY_KEY)}, got {row!r}")
    return a


def _columns(columns) -> list[str]:
    return _resolve_columns(columns)[0]


def _resolve_columns(columns) -> tuple[list[str], dict]:
    """``columns`` (keys of :data:`DEFENSES`, library :class:`Defense` objects or user defenses) as
    ``(keys, {key: user Defense})``. Raises ``ValueError`` naming ``columns`` for an unknown key, a
    non-Defense entry, a user defense whose key is a library key, or a key given twice."""
    if isinstance(columns, (str, Defense)):
        raise ValueError(f"columns must be a sequence of column keys or Defense objects, got {columns!r}")
    cols = [d.key for d in DEFENSES] if columns is None else list(columns)
    keys, user, bad = [], {}, []
    for c in cols:
        if isinstance(c, Defense) and c.kind == "user":
            if c.key in _BY_KEY:
                raise ValueError(f"columns: user defense key {c.key!r} is a library column's key; pick another")
            user[c.key] = c
            keys.append(c.key)
        elif isinstance(c, Defense) and _BY_KEY.get(c.key) == c:
            keys.append(c.key)
        elif isinstance(c, str) and c in _BY_KEY:
            keys.append(c)
        else:
            bad.append(c)
    if bad or not cols:
        raise ValueError(f"columns must be keys of DEFENSES {list(_BY_KEY)} or user Defense objects "
                         f"(Defense(key, label, 'user', fn=...)), got {bad or cols}")
    if len(set(keys)) != len(keys):
        raise ValueError(f"columns: a key is given twice, got {keys}")
    return keys, user


def run_row(row, seed: int, columns: Sequence | None = None, *, tiny: bool = False) -> dict:
    """Every applicable cell of attack ``row`` (an :class:`Attack` or its key) at ``seed``, the columns
    ``columns`` (default: all library columns) in one call; ``tiny`` shrinks every size to a few seconds a
    row (the unit tests; not a setting the book quotes). Returns ``{column key: value, "baseline": value}``
    (no entry for an n/a cell; ``"<key>@naive"`` beside a cell whose attacker knows the defense, where the row
    keeps the naive one).

    ``columns`` may mix keys of :data:`DEFENSES` and **user defenses**:
    ``Defense(key, label, "user", fn=fn, public=(...))`` with ``fn`` of the contract :data:`USER_CONTRACT`.
    Each client applies ``fn`` to its own update wherever the row applies a client-side defense (the
    generic branch of every row: no secure sum, no central noise); the cell's record name is
    ``"<row>|<key>"``, its header the Defense's ``label``. The row's attacker reads the public parameters
    the defense declares where it has a variant that uses them (:func:`attacker` says which attacker a
    cell gets: the naive one for a defense without them).

    Raises ``ValueError`` for an unknown row or column (naming ``columns``), a negative seed, a user
    defense in an outsider row (a client-side defense shows the outsider the target's message, the
    curious server's cell), or a user ``fn`` that breaks the contract."""
    a = _attack(row)
    if int(seed) != seed or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    keys, user = _resolve_columns(columns)
    if user and a.observer == OUTSIDER:
        raise ValueError(f"columns: a user defense runs on each client, so the outsider of row {a.key!r} sees the "
                         f"target's message, the curious server's cell: run it in row {a.key[:-len('_outsider')]!r}")
    cols = [c for c in keys if c not in a.not_applicable]
    token = _USER.set(user)
    try:
        return a.run(int(seed), cols, bool(tiny))
    finally:
        _USER.reset(token)


#: the public parameter each row's attacker reads when a user defense publishes it (its adaptive variant)
_READS = {"dlg": ("mask", "clip_norm"), "ig": ("mask",), "mr": ("clip_norm",), "rs": ("mask", "clip_norm"),
          "oltr": ("mask", "clip_norm"), "oltr_adm": ("mask", "clip_norm")}
#: rows whose attacker uses a published mask only where no clipping bound is published (RAIFLE's masked FCF loss
#: does not model the clipping, ``raifle_fcf``; with both it reads the clipping bound); the OLTR rows read both
_MASK_WITHOUT_CLIP = ("rs",)


def attacker(row, defense: Defense) -> str:
    """Which attacker cell ``(row, defense)`` gets for a user defense ``defense``: ``"adaptive (reads
    <names>)"`` when the row's attacker has a variant that uses one of the public parameters the defense
    declares (DLG and the OLTR rows: ``mask``, ``clip_norm``; IG: ``mask``; the eavesdropper: ``clip_norm``;
    RAIFLE against FCF: ``mask``, or ``clip_norm`` where the defense publishes one), else
    ``"naive (...)"``, the row's attack run on the view as it is (so the cell may overstate the defense).
    Raises ``ValueError`` for an unknown row or a ``defense`` that is not a user :class:`Defense`."""
    a = _attack(row)
    if not isinstance(defense, Defense) or defense.kind != "user":
        raise ValueError(f"defense must be a user Defense (kind 'user'), got {defense!r}")
    reads = [p for p in _READS.get(a.key, ()) if p in defense.public]
    if a.key in _MASK_WITHOUT_CLIP and "clip_norm" in reads:
        reads = ["clip_norm"]
    if reads:
        return f"adaptive (reads {', '.join(reads)})"
    why = ("the defense publishes no parameter" if not defense.public else
           f"this row's attack has no variant that uses {', '.join(defense.public)}")
    return f"naive ({why}: the cell may overstate the defense)"


def cell(row, column, *, tiny: bool = False) -> Callable[[int], float]:
    """The cell ``(row, column)`` as a function ``seed -> value`` (``column`` a key or a :class:`Defense`).
    Raises ``ValueError`` for an unknown row or column and for an n/a cell (its reason in the message)."""
    a = _attack(row)
    key = _columns([column])[0]
    if key in a.not_applicable:
        raise ValueError(f"cell ({a.key}, {key}) is n/a: {a.not_applicable[key]}")
    return lambda seed: run_row(a, seed, [column], tiny=tiny)[key]


def run_matrix(seed: int, *, rows: Sequence[str] | None = None, columns: Sequence[str] | None = None,
               progress: Callable[[str, float], None] | None = None) -> tuple[dict, dict]:
    """Every row at ``seed``: returns ``(values, seconds)``, ``values`` ``{value_name(row, col): float}``
    (baselines included, n/a cells absent) and ``seconds`` ``{row: wall seconds}``. ``progress(row,
    seconds)`` is called after each row."""
    keys = [a.key for a in ATTACKS] if rows is None else [_attack(r).key for r in rows]
    values, seconds = {}, {}
    for r in keys:
        t0 = time.perf_counter()
        res = run_row(r, seed, columns)
        seconds[r] = time.perf_counter() - t0
        values.update({value_name(r, c): float(v) for c, v in res.items()})
        if progress is not None:
            progress(r, seconds[r])
    return values, seconds
