"""The one round loop of every federated protocol in the book, and its history logger.

A protocol is a *state* and a *round step* ``step(t, state) -> state`` (sample clients, run their
update, apply the defense, aggregate: each protocol composes its own from the pieces of
:mod:`fedlab.fl`); :func:`run_rounds` runs rounds ``1..num_rounds``, logs ``evaluate(state)`` into a
:class:`History` after round 0 and every ``eval_every`` rounds (and after the last), shows a progress
bar when asked, and stops early when ``after_round`` says so. FedAvg / FedSGD, selective SGD, DP-FedAvg,
Centaur, IFCA, London's Protocol 1 and federated OLTR all run on it.

Every protocol keeps its own client sampler, because they are different samplers: a fixed number
(``clients_per_round``, or the fraction ``client_fraction`` of FedAvg) drawn without replacement, or
Poisson sampling with probability ``sampling_prob`` (DP-FedAvg, whose privacy analysis needs it).
"""
from __future__ import annotations

from typing import Any, Callable

from ..config import progress_enabled

__all__ = ["History", "run_rounds"]


class History(dict):
    """Per-round metrics: ``{"round": [t, ...], name: [value, ...], ...}``, one entry per logged
    round in every list. ``History("accuracy", "loss")`` starts with those (empty) columns."""

    def __init__(self, *names: str):
        super().__init__({"round": [], **{n: [] for n in names}})

    def log(self, t: int, **metrics) -> None:
        """Append round ``t`` and one value per metric (a metric not seen before starts a column).
        Raises ``ValueError`` when ``t`` is not after the last logged round."""
        if self["round"] and int(t) <= self["round"][-1]:
            raise ValueError(f"round {t} logged after round {self['round'][-1]}")
        for name in metrics:
            self.setdefault(name, [])
        self["round"].append(int(t))
        for name, value in metrics.items():
            self[name].append(value)

    @property
    def last(self) -> dict:
        """The metrics of the last logged round (``{}`` when none)."""
        return {k: v[-1] for k, v in self.items() if v}


def _progress(iterable, total, desc, progress):
    show = progress_enabled() if progress is None else progress
    if not show:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, leave=False)


def run_rounds(num_rounds: int, step: Callable[[int, Any], Any], state: Any, *,
               evaluate: Callable[[Any], dict] | None = None, eval_every: int = 1,
               history: History | None = None, after_round: Callable[[int, Any, History], bool | None] | None = None,
               progress: bool | None = False, desc: str = "rounds") -> tuple[Any, History, int]:
    """Run ``state = step(t, state)`` for ``t = 1..num_rounds``.

    With ``evaluate``, ``history.log(t, **evaluate(state))`` runs for round 0 (the initial state) and
    after every round ``t`` with ``t % eval_every == 0`` or ``t == num_rounds``. ``after_round(t,
    state, history)`` runs after each round's evaluation (bookkeeping, early stopping): returning
    ``True`` ends the run there.
    ``progress``: a tqdm bar (``None``: on when :func:`fedlab.config.progress_enabled`).

    Returns ``(state, history, rounds_run)``. Raises ``ValueError`` for ``num_rounds`` that is not a
    non-negative integer or ``eval_every < 1``.
    """
    if isinstance(num_rounds, bool) or int(num_rounds) != num_rounds or num_rounds < 0:
        raise ValueError(f"num_rounds must be a non-negative integer, got {num_rounds}")
    if int(eval_every) != eval_every or eval_every < 1:
        raise ValueError(f"eval_every must be an integer >= 1, got {eval_every}")
    num_rounds = int(num_rounds)
    history = History() if history is None else history
    if evaluate is not None:
        history.log(0, **evaluate(state))
    done = 0
    for t in _progress(range(1, num_rounds + 1), num_rounds, desc, progress):
        state = step(t, state)
        done = t
        if evaluate is not None and (t % eval_every == 0 or t == num_rounds):
            history.log(t, **evaluate(state))
        if after_round is not None and after_round(t, state, history):
            break
    return state, history, done
