"""FEDLAB_WORKERS: RAIFLE's batches of users in worker processes give the bits of one batch after the other."""
import numpy as np
import pytest
import torch

from fedlab import config
from fedlab._parallel import map_tasks
from fedlab.attacks.interaction_inference import recsys as rf
from fedlab.data.movielens import sample_user_items, synthetic_movielens
from fedlab.experiments import chapter3a as ex


def _square(x):
    return x * x


@pytest.mark.parametrize("raw, want", [("1", 1), (" 3 ", 3), ("", 1), ("auto", None)])
def test_workers_reads_fedlab_workers(monkeypatch, raw, want):
    monkeypatch.setenv("FEDLAB_WORKERS", raw)
    assert config.workers() == (want if want is not None else max(1, min(config.MAX_WORKERS, __import__("os").cpu_count() or 1)))


@pytest.mark.parametrize("raw", ["0", "-2", "2.5", "many", "257"])
def test_a_bad_fedlab_workers_names_it(monkeypatch, raw):
    monkeypatch.setenv("FEDLAB_WORKERS", raw)
    with pytest.raises(ValueError, match="FEDLAB_WORKERS"):
        config.workers()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_map_tasks_refuses_bad_workers(bad):
    with pytest.raises(ValueError, match="workers"):
        map_tasks(_square, [1, 2], workers=bad)


def test_map_tasks_in_this_process_keeps_the_order_and_is_lazy():
    made = []

    def tasks():
        for i in range(4):
            made.append(i)
            yield i

    out = []
    for r in map_tasks(_square, tasks(), workers=1):
        out.append(r)
    assert out == [0, 1, 4, 9] and made == [0, 1, 2, 3]


def _case():
    data = synthetic_movielens(num_users=12, num_items=200, mean_ratings=14.0, min_ratings=8, seed=1)
    items = sample_user_items(data, neg_ratio=4, users=np.arange(9), seed=1)
    return rf.make_recsys_case(items, data.num_items, dim=8, fncf_lr=1.0, local_steps=1, seed=1)


@pytest.mark.slow
def test_batches_in_two_worker_processes_give_the_bits_of_one_process(monkeypatch):
    """FCF and FNCF batches of attack_case, mixed, through one pool of two spawned workers: every result equals,
    bit for bit and in the order of the tasks, the result of the same batch run here; and attack_case with
    FEDLAB_WORKERS=1 is those batches put together (one pool only: each start costs a torch import per worker)."""
    case = _case()
    budget = rf.RaifleBudget(max_iter=60, num_restarts=2)
    variants = {"fcf": rf.RaifleVariant(estimate_embedding=True), "fncf": rf.RaifleVariant(estimate_embedding=True)}
    order = torch.argsort(case.mask.sum(1), stable=True)
    batches = [order[s:s + 4] for s in range(0, len(case), 4)]      # 4, 4 and 1 users
    ids = torch.arange(len(case))
    tasks = [ex._batch_task(case, idx, alg, variants[alg], None, ids, None, {"budget": budget, "seed": 3})
             for alg in ("fncf", "fcf") for idx in batches]
    here = [ex._attack_batch(t) for t in tasks]
    there = map_tasks(ex._attack_batch, tasks, workers=2)
    for (a_auc, a), (b_auc, b) in zip(here, there):
        assert torch.equal(a_auc, b_auc) and torch.equal(a.scores, b.scores) and torch.equal(a.loss, b.loss)
        assert torch.equal(a.user_emb, b.user_emb) and torch.equal(a.loss_truth, b.loss_truth)
        assert a.iterations == b.iterations
    monkeypatch.setenv("FEDLAB_WORKERS", "1")
    for k, alg in enumerate(("fncf", "fcf")):
        res = ex.attack_case(case, alg, variant=variants[alg], budget=budget, batch_size=4, seed=3)
        for idx, (auc, r) in zip(batches, here[3 * k:3 * k + 3]):
            assert torch.equal(res["auc"][idx], auc) and torch.equal(res["loss"][idx], r.loss)


def test_network_draws_put_together_the_batches_a_worker_would_run(monkeypatch):
    """fncf_network_draws (FEDLAB_WORKERS=1) equals, bit for bit, its batches of users run one by one through
    ``_draws_batch``, the function a worker runs (that a worker gives the bits of this process is the test above);
    three batches of one user, two draws, one FNCF row."""
    monkeypatch.setenv("FEDLAB_WORKERS", "1")
    case = _case().subset(np.arange(3))
    row = ("FNCF", True, False)
    got = ex.fncf_network_draws(case, 2, fncf_max_iter=40, num_restarts=2, seed=2, configs=[row], batch_size=2)
    seeds = ex.network_draw_seeds(2, 2)
    order = torch.argsort(case.mask.sum(1), stable=True)
    for u in order:
        idx = u.reshape(1)
        res = ex._draws_batch((ex.network_draws_case(case.subset(idx), seeds), idx, 2, [row], 40, 2, 2))[row]
        for key in ("auc", "loss", "loss_truth", "emb_error"):
            assert torch.equal(got[row][key][:, idx], res[key].reshape(2, 1).to(got[row][key].dtype)), key
