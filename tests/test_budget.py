"""fedlab.attacks.budget: the optimiser budget the attacks share, validated field by field."""
import dataclasses

import pytest

from fedlab import attacks
from fedlab.attacks import gradient_inversion as gi
from fedlab.attacks.budget import AttackBudget


def test_attack_budget_is_exported_frozen_and_keeps_the_papers_defaults():
    assert attacks.AttackBudget is AttackBudget is gi.AttackBudget
    b = AttackBudget(max_iter=20, lr=1.0, steps=300)
    assert (b.num_restarts, b.history_size, b.steps) == (1, 100, 300)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.max_iter = 3
    assert b == AttackBudget(max_iter=20, lr=1.0, steps=300) and b != AttackBudget(max_iter=21, lr=1.0, steps=300)
    # the values the attacks used as defaults before they took a budget
    assert gi.DLG_BUDGET == AttackBudget(max_iter=100, lr=1.0, num_restarts=1, history_size=100, steps=None)
    assert gi.IG_BUDGET == AttackBudget(max_iter=200, lr=0.1, num_restarts=1)
    assert AttackBudget(max_iter=3.0, lr=1).max_iter == 3 and isinstance(AttackBudget(max_iter=3.0, lr=1).max_iter, int)


@pytest.mark.parametrize("field, kwargs", [
    ("max_iter", dict(max_iter=0)), ("max_iter", dict(max_iter=2.5)), ("max_iter", dict(max_iter=True)),
    ("lr", dict(lr=0.0)), ("lr", dict(lr=float("nan"))), ("lr", dict(lr=float("inf"))), ("lr", dict(lr="1")),
    ("num_restarts", dict(num_restarts=0)), ("history_size", dict(history_size=-1)), ("steps", dict(steps=0)),
])
def test_a_bad_field_raises_naming_it(field, kwargs):
    with pytest.raises(ValueError, match=f"AttackBudget.{field}"):
        AttackBudget(**{"max_iter": 10, "lr": 1.0, **kwargs})
