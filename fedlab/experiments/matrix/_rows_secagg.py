"""The matrix's row of Chapter 6b: the malicious server inside Flower's SecAgg+ (false dropout, split view, model
inconsistency), against stock SecAgg+ and SecAgg+ with the consistency round."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

from ...attacks import gradient_inversion as gi
from ...fl import LocalTraining
from .layout import _size


# ----------------------------------------------------------------------------------------------------
# the malicious server inside SecAgg+, through Flower's SecAgg+ (fedlab.flower)
#: the row's key; its cells run :func:`fedlab.flower.run` with ``aggregation=flower.SecAgg(...)``
SECAGG_ROW = "secagg_lie"
#: the malicious server's attacks inside SecAgg+ (:mod:`fedlab.flower.attacks`), in the order the row runs them
SECAGG_ATTACKS = ("false_dropout", "split_view", "inconsistent_model")
#: clients of the SecAgg+ round (Chapter 6b's FedSGD federation) and FedSGD's learning rate
_SA_CLIENTS, _SA_LR = 8, 0.1
#: random starts of every inversion in the row (Chapter 6b's attacker: one start stalled on a rounded model)
_SA_STARTS = 4
#: the SecAgg+ settings of the consistency column: Bonawitz et al.'s consistency round needs ``t > n / 2``
#: (Chapter 6b: at the default ``t`` every client refuses the setup); stock SecAgg+ keeps Flower's defaults
SECAGG_CONSISTENT_SETTINGS = {"reconstruction_threshold": 0.6}
#: the cell note of the consistency column: what the row does when the clients refuse
SECAGG_REFUSED_NOTE = ("when the clients refuse (or the attack cannot be mounted), the round stops before the server "
                       "gets any share of a survivor's key; the server's best is then an honest round, whose sum is "
                       "the row's baseline: the cell is that sum's inversion")


def _secagg_lie_row(seed: int, columns: Sequence[str], tiny: bool = False) -> dict:
    """The malicious server inside secure aggregation (Chapter 6b; Bonawitz et al. 2017, Sec. 6-7): one FedSGD
    round of Chapter 6b's federation (:func:`fedlab.experiments.chapter6.fedsgd_clients`: 8 clients, one digit
    each, the sigmoid LeNet, lr 0.1) through **Flower's SecAgg+** (:func:`fedlab.flower.run` with
    ``aggregation=flower.SecAgg()``, in-process engine), the target client ``seed % 8``. The server mounts each attack of
    :data:`SECAGG_ATTACKS` (:class:`fedlab.flower.attacks.FalseDropout`, :class:`~fedlab.flower.attacks.SplitView`,
    :class:`~fedlab.flower.attacks.InconsistentModel` with the zero decoy) against stock SecAgg+ (column
    ``secagg``, Flower's default settings) and against SecAgg+ with the consistency round (column
    ``secagg_cr``: ``consistency=True`` with :data:`SECAGG_CONSISTENT_SETTINGS`).

    Metric: the PSNR (dB) of the attacker's best reconstruction of the target's digit, iDLG on the target's
    FedSGD gradient ``(w_global - w_target) / lr`` as Chapter 6b (:func:`fedlab.flower.attacks.invert_model`, from
    :data:`_SA_STARTS` random starts, the start of least matching loss kept, as Chapter 6b),
    with the target's model as the server recovered it: unmasked alone (false dropout, split view), or isolated
    from the decoded sum on the parameters the decoy silences (model inconsistency; DLG then matches only
    those, labels learned: the output layer is not isolated). A round that completes without exposing the
    target, one the clients refuse, and an attack that cannot be mounted leave the server the honest round's
    sum (:data:`SECAGG_REFUSED_NOTE`): iDLG on the sum of the 8 models is the row's **baseline** (the sum-only
    view secure aggregation promises). Column ``none``: no secure aggregation, the server reads the target's
    model from the plain Flower round. A cell is the best of the three attacks; each attack's value is kept as
    ``"<column>@<attack>"``, and ``"<column>@exposed"`` counts the attacks that got the target's model.
    ``tiny``: fewer L-BFGS iterations (40 instead of 100). Needs the ``flower`` extra. Raises ``ValueError``
    for a column other than ``none``, ``secagg`` and ``secagg_cr``."""
    from ... import flower
    from ...flower import attacks as fa
    from .. import chapter6 as ch6

    bad = [c for c in columns if c not in ("none", "secagg", "secagg_cr")]
    if bad:
        raise ValueError(f"columns: row {SECAGG_ROW!r} has only the columns none, secagg and secagg_cr, got {bad}")
    iters = _size(tiny, tiny_value=40, quick=100, paper=300)
    target = int(seed) % _SA_CLIENTS
    victims, lenet = ch6.fedsgd_clients(seed, _SA_CLIENTS)
    args = dict(num_rounds=1, local=LocalTraining(lr=_SA_LR, batch_size=None), seed=seed,   # one step
                engine=flower.Engine("local"))
    x_true = victims[target][0]
    plain = flower.run(lenet, victims, **args)
    w0 = plain.transcript.globals[0]

    def invert(w: Mapping) -> float:
        return float(fa.invert_model(lenet, w0, w, lr=_SA_LR, input_shape=(1, 8, 8), num_classes=10, max_iter=iters,
                                     x_true=x_true, seed=seed, num_restarts=_SA_STARTS)[2])

    def invert_silenced(w: Mapping, silent: Sequence[str]) -> float:
        grad = {k: ((torch.as_tensor(w0[k]).double() - torch.as_tensor(w[k]).double()) / _SA_LR)
                .to(torch.as_tensor(w0[k]).dtype)[None].repeat(_SA_STARTS, *([1] * w0[k].dim())) for k in w0}
        mask = {k: torch.full_like(v, k in silent, dtype=torch.bool) for k, v in grad.items()}
        res = gi.dlg(lenet(), dict(w0), grad, knows=gi.Knowledge(input_shape=(1, 8, 8), num_classes=10, batch_size=1,
                                                                 mask=mask),
                     budget=gi.AttackBudget(max_iter=iters, lr=1.0), stacked=True, seed=seed)
        loss = np.asarray(res.final_loss, dtype=float)
        best = int(np.argmin(np.where(np.isfinite(loss), loss, np.inf)))          # the start of least matching loss
        return float(gi.matched_psnr(res.x[best], x_true)[0])

    honest = ch6.secagg_outcome(lambda: flower.run(lenet, victims, aggregation=flower.SecAgg(), **args))
    if not honest["completed"] or honest["exposed"]:
        raise RuntimeError(f"the honest SecAgg+ round did not complete with nothing exposed: {honest['reason']}")
    base = invert(honest["run"].params)
    out = {"baseline": base}
    if "none" in columns:
        out["none"] = invert({r.partition_id: r.params for r in plain.transcript.train_replies(1)}[target])
    decoy = fa.zero_decoy(lenet)
    probes = torch.rand(32, 1, 8, 8, generator=torch.Generator().manual_seed(seed))
    attacks = {"false_dropout": lambda: fa.FalseDropout(target), "split_view": lambda: fa.SplitView(target),
               "inconsistent_model": lambda: fa.InconsistentModel(target, decoy)}
    for c in [c for c in columns if c != "none"]:
        consistency = c == "secagg_cr"
        settings = dict(SECAGG_CONSISTENT_SETTINGS) if consistency else {}
        got, exposed = {}, 0
        for name in SECAGG_ATTACKS:
            o = ch6.secagg_outcome(lambda name=name: flower.run(
                lenet, victims, aggregation=flower.SecAgg(**settings, consistency=consistency, attack=attacks[name]()),
                **args))
            if target in o["exposed"]:
                got[name], exposed = invert(ch6.exposed_model(o, target)), exposed + 1
            elif name == "inconsistent_model" and o["completed"]:
                silent = fa.silenced_parameters(lenet, decoy, probes, torch.arange(32) % 10)
                if silent:
                    w = fa.isolate_from_aggregate(o["run"].transcript, target, decoy)
                    got[name], exposed = invert_silenced(w, silent), exposed + 1
                else:
                    got[name] = invert(o["run"].params)
            elif o["completed"]:
                got[name] = invert(o["run"].params)         # the sum of a round that exposed nothing
            else:
                got[name] = base                             # refused: an honest round's sum is all the server gets
        out[c] = max(got.values())
        out.update({f"{c}@{name}": v for name, v in got.items()})
        out[f"{c}@exposed"] = float(exposed)
    return out
