"""Independent runs of one protocol advanced together, their local SGD steps in one ``vmap``.

A sweep runs a protocol many times: one learning rate, client fraction, data split or upload
fraction after another. An SGD step of :func:`fedlab.fl.clients_update` costs a few milliseconds of
``torch.func`` bookkeeping whatever the number of clients it carries, so what a sweep costs is the
number of steps run *one after another*. The functions here keep each run's own random generator and
draw its clients and mini-batches from it exactly as the single-run function does, in the same order;
only the local SGD steps are stacked: the clients of every run whose mini-batches have the same size
``B`` become rows of one vmapped step (a run with fewer steps idles on all-zero weights, which changes
nothing, as in :func:`fedlab.fl.batch_plan`). A row's result depends on its own inputs only, so each
run returns what the single-run function returns, bit for bit (``tests/test_stacked.py`` compares
them with ``torch.equal``):

* :func:`clients_update_runs`: several :func:`fedlab.fl.clients_update` calls;
* :func:`fedavg_runs`: several :func:`fedlab.fl.fedavg` runs (optionally stopped at a target accuracy);
* :func:`selective_sgd_runs`: several :func:`fedlab.fl.selective_sgd` runs on the same participants.

Shapes: a *job* is the local training of ``k`` clients: stacked parameters ``{name: [k, ...]}``, data
``X`` ``[k, n, ...]``, ``y`` ``[k, n]`` and a batch plan ``idx``, ``weight`` ``[k, S, B]``.
"""
from __future__ import annotations

import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from .._checks import finite_positive, finite_tensor, positive_int, run_spec
from ..config import device as _device
from ..models import flatten_params, unflatten_params
from .local import ClientData, LocalTraining, _local, _spec_local, cross_entropy, stack_clients
from .protocols import FLResult, select_upload, weighted_average
from .rounds import History

__all__ = ["SGDJob", "sgd_jobs", "batch_plan", "PlanCache", "clients_update_runs", "fedavg_runs", "selective_sgd_runs"]


@dataclass
class SGDJob:
    """The local SGD of ``k`` clients, one row each: ``params`` ``{name: [k, ...]}`` (the starting
    points), ``X`` ``[k, n, ...]``, ``y`` ``[k, n]``, the batch plan ``idx``, ``weight`` ``[k, S, B]``
    (:func:`fedlab.fl.batch_plan`) and the step size ``lr``. ``single``: a job of one client that
    :func:`fedlab.fl.clients_update` would run without ``vmap`` (it does so for ``K = 1``); it runs so
    here too when no other job shares its batch size."""

    params: dict
    X: torch.Tensor
    y: torch.Tensor
    idx: torch.Tensor
    weight: torch.Tensor
    lr: float
    single: bool = False


def _step_fn(model: nn.Module, loss_fn):
    """One masked SGD step of one row on the parameters ``sub`` with ``frozen`` held fixed: the step
    of :func:`fedlab.fl.clients_update` (``frozen`` empty) and of
    :func:`fedlab.fl.personalization.partial_clients_update`, written the same way, with the step size
    an argument (a float, or one entry of a per-row tensor under ``vmap``)."""

    def batch_loss(sub, frozen, X, y, idx, w):
        out = functional_call(model, {**frozen, **sub}, (X[idx],))
        return (loss_fn(out, y[idx]) * w).sum() / w.sum().clamp_min(1.0)

    g = grad(batch_loss)

    def step(sub, frozen, X, y, idx, w, lr):
        gr = g(sub, frozen, X, y, idx, w)
        return {k: sub[k] - lr * gr[k] for k in sub}

    return step


#: trace each vmapped step once per input shape (:func:`torch.fx.experimental.proxy_tensor.make_fx`) and
#: replay the recorded ATen calls: the same kernels on the same inputs, without ``torch.func``'s
#: per-call bookkeeping (about 2-3x faster here). Off: every step runs through ``torch.func``.
TRACE_STEPS = True
_TRACES: "weakref.WeakKeyDictionary[nn.Module, dict]" = weakref.WeakKeyDictionary()


#: a trace costs about as much as this many steps through ``torch.func``: a shape is traced once it has
#: run that many steps untraced (a shape seen for a few steps only is never traced)
_TRACE_AFTER = 50


def _traced(model: nn.Module, fn, key: tuple, args: tuple, steps: int):
    """``fn`` recorded as a graph of ATen calls for inputs shaped like ``args`` (cached per model and
    ``key``) once ``fn`` ran :data:`_TRACE_AFTER` steps on that shape, else ``fn`` itself (also when
    tracing is off, an input is not on the CPU, tracing fails, or the graph's output on ``args`` is not
    ``fn``'s, bit for bit). ``steps``: the steps about to run."""
    leaves, spec = torch.utils._pytree.tree_flatten(args)
    if not TRACE_STEPS or any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in leaves):
        return fn
    sig = key + (str(spec),) + tuple((tuple(a.shape), a.dtype, a.stride()) if isinstance(a, torch.Tensor) else a for a in leaves)
    cache = _TRACES.setdefault(model, {})
    seen = cache.get(sig, 0)
    if isinstance(seen, int):
        if seen + steps <= _TRACE_AFTER and seen < _TRACE_AFTER:
            cache[sig] = seen + steps
            return fn
        cache[sig] = fn
        try:
            from torch.fx.experimental.proxy_tensor import make_fx

            graph = _simplify(make_fx(fn)(*args))
            # keep the graph only if it gives what torch.func gives on these inputs, bit for bit
            want, got = torch.utils._pytree.tree_leaves(fn(*args)), torch.utils._pytree.tree_leaves(graph(*args))
            if len(want) == len(got) and all(torch.equal(a, b) for a, b in zip(want, got)):
                cache[sig] = graph
        except Exception:   # noqa: BLE001 - any failure: run the step through torch.func as before
            pass
    return cache[sig]


def _simplify(gm):
    """Drop from a traced step the calls that compute nothing: views that hand back the layout (shape,
    strides, offset) of a tensor up their chain of views, multiplications by the scalar 1, unused
    results, and repeats of a call already made with the same arguments. Every remaining call is one
    the step made, on the same inputs. A graph with an in-place call is left alone."""
    aten = torch.ops.aten
    g = gm.graph
    if any(n.op == "call_function" and getattr(getattr(n.target, "_schema", None), "is_mutable", True)
           for n in g.nodes):
        return gm
    views = {aten.view.default, aten.expand.default, aten._unsafe_view.default, aten.reshape.default,
             aten.transpose.int, aten.squeeze.dims, aten.unsqueeze.default, aten.alias.default}

    def layout(node):
        v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        return (tuple(v.shape), v.stride(), v.storage_offset(), v.dtype) if isinstance(v, torch.Tensor) else None

    for node in list(g.nodes):
        if node.op != "call_function" or any(u.op == "output" for u in node.users) or layout(node) is None:
            continue
        src = None
        if node.target in views:
            up = node.args[0]
            while isinstance(up, torch.fx.Node):
                if layout(up) == layout(node):
                    src = up
                    break
                if up.op != "call_function" or up.target not in views:
                    break
                up = up.args[0]
        elif node.target is aten.mul.Scalar and node.args[1] == 1 and layout(node.args[0]) == layout(node):
            src = node.args[0]
        if src is not None:
            node.replace_all_uses_with(src)
            g.erase_node(node)
    g.eliminate_dead_code()
    seen = {}

    def frozen(a):
        return tuple(frozen(x) for x in a) if isinstance(a, (list, tuple)) else a

    for node in list(g.nodes):
        if node.op != "call_function":
            continue
        key = (node.target, frozen(node.args), frozen(sorted(node.kwargs.items())))
        try:
            hash(key)
        except TypeError:
            continue
        if key in seen:
            node.replace_all_uses_with(seen[key])
            g.erase_node(node)
        else:
            seen[key] = node
    g.lint()
    gm.recompile()
    return gm


def _bucket(rows: int) -> int:
    """The number of rows a vmapped step runs with for ``rows`` real ones: when steps are traced, rounded
    up (by less than an eighth) so that runs whose row count varies from round to round (client sampling)
    share a few traced shapes; the extra rows are all-zero (parameters, data, weights: a step that changes
    nothing) and dropped. A row's result does not depend on the other rows."""
    if not TRACE_STEPS:
        return rows
    step = 1 << max(rows.bit_length() - 4, 0)
    return -(-rows // step) * step


def _pad(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``t`` zero-padded along ``dim`` to ``size``."""
    if t.shape[dim] == size:
        return t
    shape = list(t.shape)
    shape[dim] = size - shape[dim]
    return torch.cat([t, torch.zeros(shape, dtype=t.dtype, device=t.device)], dim=dim)


def _run_group(model: nn.Module, jobs: Sequence[SGDJob], train: list[str], loss_fn) -> list[dict]:
    """Jobs sharing the batch size ``B``: one row per client, one vmapped step per plan step."""
    step = _step_fn(model, loss_fn)
    if len(jobs) == 1 and jobs[0].single:          # fl.clients_update's loop for one client, no vmap
        j = jobs[0]
        sub = {k: j.params[k][0] for k in train}
        frozen = {k: v[0] for k, v in j.params.items() if k not in train}
        lr = float(j.lr)
        args = (sub, frozen, j.X[0], j.y[0], j.idx[0, 0], j.weight[0, 0], lr)
        run = _traced(model, step, ("single", loss_fn, tuple(train), lr), args, j.idx.shape[1])
        for s in range(j.idx.shape[1]):
            sub = run(sub, frozen, j.X[0], j.y[0], j.idx[0, s], j.weight[0, s], lr)
        return [{k: (sub[k] if k in sub else j.params[k][0]).unsqueeze(0) for k in j.params}]
    S = max(j.idx.shape[1] for j in jobs)
    n = max(j.X.shape[1] for j in jobs)
    rows = [j.idx.shape[0] for j in jobs]
    R = sum(rows)
    X = _pad(torch.cat([_pad(j.X, 1, n) for j in jobs]), 0, _bucket(R))
    y = _pad(torch.cat([_pad(j.y, 1, n) for j in jobs]), 0, _bucket(R))
    idx = _pad(torch.cat([_pad(j.idx, 1, S) for j in jobs]), 0, _bucket(R))
    w = _pad(torch.cat([_pad(j.weight, 1, S) for j in jobs]), 0, _bucket(R))
    params = {k: _pad(torch.cat([j.params[k] for j in jobs]), 0, _bucket(R)) for k in jobs[0].params}
    sub = {k: params[k].clone() for k in train}
    frozen = {k: v for k, v in params.items() if k not in train}
    lrs = [float(j.lr) for j in jobs]
    if len(set(lrs)) == 1:
        lr, lr_dim = lrs[0], None
    else:
        dtype = next(iter(sub.values())).dtype
        lr = _pad(torch.cat([torch.full((r,), v, dtype=dtype) for r, v in zip(rows, lrs)]), 0, _bucket(R)).to(X.device)
        lr_dim = 0
    vstep = vmap(step, in_dims=(0, 0, 0, 0, 0, 0, lr_dim))
    args = (sub, frozen, X, y, idx[:, 0], w[:, 0], lr)
    run = _traced(model, vstep, ("vmap", loss_fn, tuple(train), lr if lr_dim is None else None), args, S)
    for s in range(S):
        sub = run(sub, frozen, X, y, idx[:, s], w[:, s], lr)
    out, start = [], 0
    for j, r in zip(jobs, rows):
        out.append({k: (sub[k] if k in sub else params[k])[start:start + r].clone() for k in params})
        start += r
    return out


def sgd_jobs(model: nn.Module, jobs: Sequence[SGDJob], *, trainable: Sequence[str] | None = None,
             loss_fn=cross_entropy) -> list[dict]:
    """Run every job's local SGD, the jobs with the same batch size ``B`` in one vmapped loop (their
    rows concatenated, data padded to a common length, plans padded with all-zero steps), and return
    each job's stacked parameters ``{name: [k, ...]}`` in order. Each equals, bit for bit, the result
    of running its job alone (:func:`fedlab.fl.clients_update` with that plan). ``trainable`` (default:
    every parameter) are the parameters trained, the others held fixed. Raises ``ValueError`` for no
    jobs or a step size that is not finite and > 0."""
    if not jobs:
        raise ValueError("jobs must hold at least one job")
    for j in jobs:
        finite_positive("lr", j.lr)
    names = list(jobs[0].params)
    train = names if trainable is None else [k for k in names if k in set(trainable)]
    out: list[dict | None] = [None] * len(jobs)
    groups: dict[int, list[int]] = {}
    for i, j in enumerate(jobs):
        groups.setdefault(int(j.idx.shape[2]), []).append(i)
    for members in groups.values():
        for i, res in zip(members, _run_group(model, [jobs[i] for i in members], train, loss_fn)):
            out[i] = res
    return out


def batch_plan(n: torch.Tensor, batch_size: int | None, local_epochs: int,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fedlab.fl.batch_plan` (epochs, no ``local_steps``), bit for bit, with the same draws from
    ``generator`` in the same order (one ``randperm`` per client and epoch), each shuffle laid into the
    plan with one copy instead of one per batch. Raises ``ValueError`` as that function does."""
    if int(local_epochs) != local_epochs or local_epochs < 1:
        raise ValueError(f"local_epochs must be a positive integer, got {local_epochs}")
    n = torch.as_tensor(n, dtype=torch.long, device="cpu")
    if n.ndim != 1 or n.numel() == 0 or bool((n < 1).any()):
        raise ValueError(f"n must be a non-empty vector of client sizes >= 1 (a client without data has no "
                         f"batch), got {n.tolist()}")
    E = int(local_epochs)
    sizes = n.tolist()
    n_max = max(sizes)
    B = min(n_max if batch_size is None else positive_int("batch_size", batch_size), n_max)
    per_epoch = [math.ceil(nk / B) for nk in sizes]
    S = E * max(per_epoch)
    idx = torch.zeros((len(sizes), S, B), dtype=torch.long, device="cpu")
    weight = torch.zeros((len(sizes), S, B), device="cpu")
    # the shuffles, drawn client by client and epoch by epoch as fl.batch_plan draws them; then, per
    # group of clients with the same number of batches per epoch, every shuffle fills the first slots
    # of its epoch's per_epoch * B (one masked copy for the group)
    perms = [torch.randperm(nk, generator=generator, device="cpu") for nk in sizes for _ in range(E)]
    for pe in sorted(set(per_epoch)):
        ks = [k for k, p in enumerate(per_epoch) if p == pe]
        kt = torch.tensor(ks)
        lengths = n[kt].unsqueeze(1).expand(len(ks), E).reshape(-1)
        live = torch.arange(pe * B).unsqueeze(0) < lengths.unsqueeze(1)              # [len(ks) E, pe B]
        slots = torch.zeros(live.shape, dtype=torch.long)
        slots[live] = torch.cat([perms[k * E + e] for k in ks for e in range(E)])
        idx[kt, :E * pe] = slots.view(len(ks), E * pe, B)
        weight[kt, :E * pe] = live.float().view(len(ks), E * pe, B)
    return idx, weight


class PlanCache:
    """:func:`fedlab.fl.batch_plan` for many runs whose generators are often in the same state (runs
    seeded alike whose draws so far were alike): a plan already drawn from a generator in this state,
    for the same sizes, is handed out again and the generator set to the state the draw left it in, so
    every generator ends exactly where drawing the plan itself would leave it. The plans handed out
    are shared: read them, do not write into them."""

    def __init__(self):
        self._plans: dict = {}

    def batch_plan(self, n: torch.Tensor, batch_size: int | None, local_epochs: int,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        key = (generator.get_state().numpy().tobytes(), tuple(torch.as_tensor(n).tolist()), batch_size, local_epochs)
        if key not in self._plans:
            idx, w = batch_plan(n, batch_size, local_epochs, generator)
            self._plans[key] = (idx, w, generator.get_state())
        idx, w, after = self._plans[key]
        generator.set_state(after)
        return idx, w


def _expand(params: dict, K: int) -> dict:
    return {k: v.unsqueeze(0).expand(K, *v.shape).clone() for k, v in params.items()}


def clients_update_runs(model: nn.Module, runs: Sequence[Mapping], *, loss_fn=cross_entropy) -> list[dict]:
    """Several :func:`fedlab.fl.clients_update` calls at once. Each run is a mapping of that function's
    arguments: ``params``, ``data`` (:class:`fedlab.fl.ClientData`), ``lr``, and optionally
    ``local_epochs`` (1), ``batch_size`` (``None``), ``generator`` and ``stacked`` (``False``). The batch
    plans are drawn run by run, in order (runs sharing a generator draw from it in that order, as
    consecutive calls would). Returns each run's stacked parameters ``{name: [K, ...]}``, bit for bit
    those of :func:`fedlab.fl.clients_update`. Raises ``ValueError`` for an unknown argument."""
    allowed = {"params", "data", "lr", "local_epochs", "batch_size", "generator", "stacked"}
    jobs = []
    for r in runs:
        bad = set(r) - allowed
        if bad:
            raise ValueError(f"unknown clients_update arguments {sorted(bad)}")
        data, params = r["data"], r["params"]
        K = data.num_clients
        p = {k: v.clone() for k, v in params.items()} if r.get("stacked", False) else _expand(params, K)
        idx, w = batch_plan(data.n, r.get("batch_size"), r.get("local_epochs", 1), r.get("generator"))
        jobs.append(SGDJob(p, data.X, data.y, idx.to(data.X.device), w.to(data.X.device), r["lr"], single=K == 1))
    return sgd_jobs(model, jobs, loss_fn=loss_fn)


_FEDAVG_ARGS = {"clients": None, "lr": 0.1, "client_fraction": 1.0, "local_epochs": 1, "batch_size": 10,
                "params": None, "seed": 0}


class _Run:
    """The state of one FedAvg run of :func:`fedavg_runs`."""

    def __init__(self, model, spec: Mapping, dev, evaluate_fn, loss_fn=cross_entropy):
        a = run_spec(_spec_local(spec, loss_fn), _FEDAVG_ARGS, ("clients",), "the fedavg arguments")
        if not 0.0 < a["client_fraction"] <= 1.0:
            raise ValueError(f"client_fraction must be in (0, 1], got {a['client_fraction']}")
        finite_positive("lr", a["lr"])
        self.lr = a["lr"]
        self.local_epochs, self.batch_size = a["local_epochs"], a["batch_size"]
        data = a["clients"] if isinstance(a["clients"], ClientData) else stack_clients(a["clients"])
        finite_tensor("clients' X", data.X, " (one NaN makes every parameter NaN after the first round)")
        self.data = ClientData(data.X.to(dev), data.y.to(dev), data.n)
        self.K = self.data.num_clients
        self.m = max(int(round(a["client_fraction"] * self.K)), 1)
        self.gen = torch.Generator().manual_seed(a["seed"])
        w = {k: v.detach().clone() for k, v in (a["params"] or dict(model.named_parameters())).items()}
        finite_tensor("params", w)
        self.w = {k: v.to(dev) for k, v in w.items()}
        self.history = History("accuracy", "loss")
        self.evaluate = evaluate_fn
        self.active = True

    def log(self, t: int, stop_at) -> None:
        if self.evaluate is None:
            return
        self.history.log(t, **self.evaluate(self.w))
        if stop_at is not None and self.history["accuracy"][-1] >= stop_at:
            self.active = False


def fedavg_runs(model: nn.Module, runs: Sequence[Mapping], *, num_rounds: int, eval_data=None,
                stop_at: float | None = None, loss_fn=cross_entropy, device=None) -> list[FLResult]:
    """Several FedAvg runs (McMahan et al. 2017, Algorithm 1) advanced round by round together, each
    exactly :func:`fedlab.fl.fedavg` with its own arguments: a run is a mapping of ``clients`` and
    optionally ``local`` (a :class:`fedlab.fl.LocalTraining` without ``local_steps`` or ``weight_decay``, its loss
    the shared ``loss_fn``; or, flat, ``lr`` (0.1), ``local_epochs`` (1), ``batch_size`` (10; ``None`` is B =
    infinity)), ``client_fraction`` (1), ``params`` and ``seed`` (0), fedavg's defaults. Every run samples its
    clients and mini-batches from its own generator, in fedavg's order, and is evaluated on ``eval_data`` after
    round 0 and every round; the local steps of all runs go through :func:`sgd_jobs`.

    ``stop_at``: a run stops after the first evaluation whose accuracy reaches it (its history ends there;
    :func:`fedlab.metrics.rounds_to_accuracy` gives the same round as on the full run). ``device`` as in
    :func:`fedlab.fl.fedavg`.

    Returns one :class:`fedlab.fl.FLResult` per run, in order, bit for bit those of
    :func:`fedlab.fl.fedavg` (cut at ``stop_at``). Raises ``ValueError`` for no runs, an unknown or
    invalid argument, ``num_rounds`` not a positive integer, ``stop_at`` without ``eval_data``, or a run
    that diverges (naming ``lr``)."""
    num_rounds = positive_int("num_rounds", num_rounds)
    if not runs:
        raise ValueError("runs must hold at least one run")
    if stop_at is not None and eval_data is None:
        raise ValueError("stop_at needs eval_data")
    dev = _device(device)
    from .local import _model_on
    from .protocols import eval_fn

    on_model = _model_on(model, dev)
    ev = eval_fn(model, eval_data, loss_fn, dev)
    state = [_Run(model, r, dev, ev, loss_fn) for r in runs]
    for r in state:
        r.log(0, stop_at)
    for t in range(1, num_rounds + 1):
        live = [r for r in state if r.active]
        if not live:
            break
        jobs, subs = [], []
        for r in live:
            selected = torch.randperm(r.K, generator=r.gen, device="cpu")[:r.m].sort().values
            sub = r.data.select(selected)
            idx, w = batch_plan(sub.n, r.batch_size, r.local_epochs, r.gen)
            jobs.append(SGDJob(_expand(r.w, r.m), sub.X, sub.y, idx.to(dev), w.to(dev), r.lr, single=r.m == 1))
            subs.append(sub)
        for r, sub, local in zip(live, subs, sgd_jobs(on_model, jobs, loss_fn=loss_fn)):
            new = weighted_average(local, sub.n.float())
            finite_tensor(f"the global parameters after round {t}", new, f" (training diverged: lower lr, got {r.lr})")
            r.w = new
            r.log(t, stop_at)
    cpu = (lambda d: d) if dev.type == "cpu" else (lambda d: {k: v.cpu() for k, v in d.items()})
    return [FLResult(cpu(r.w), r.history) for r in state]


def selective_sgd_runs(model: nn.Module, clients, configs: Sequence[Mapping], *, num_rounds: int,
                       local: LocalTraining = LocalTraining(batch_size=32), download_fraction: float = 1.0,
                       params: dict | None = None, seed: int = 0, eval_data=None) -> list[FLResult]:
    """Several distributed selective SGD runs (Shokri & Shmatikov 2015, :func:`fedlab.fl.selective_sgd`)
    on the same participants, one per entry of ``configs`` (a mapping of ``upload_fraction``, and
    optionally ``criterion`` ("largest") and ``threshold`` (0)), every other argument shared. Each run
    has its own generator seeded with ``seed`` and draws from it what ``selective_sgd`` draws, in the
    same order; the participants take turns as there, and at each turn the local SGD of every run is
    one vmapped job (:func:`sgd_jobs`). Returns one :class:`fedlab.fl.FLResult` per config, bit for
    bit that of :func:`fedlab.fl.selective_sgd`. ``local``: the participants' :class:`fedlab.fl.LocalTraining`
    (epochs, batch, step and loss; neither ``local_steps`` nor ``weight_decay``). Raises ``ValueError`` as that
    function does, and for no configs or an unknown config key."""
    local_training = _local(local)
    if local_training.local_steps is not None or local_training.weight_decay != 0:
        raise ValueError("local: selective_sgd_runs trains local_epochs epochs without weight decay, got "
                         f"local_steps={local_training.local_steps}, weight_decay={local_training.weight_decay}")
    lr, local_epochs, batch_size, loss_fn = (local_training.lr, local_training.local_epochs, local_training.batch_size,
                                             local_training.loss_fn)
    if not 0.0 < download_fraction <= 1.0:
        raise ValueError(f"download_fraction must be in (0, 1], got {download_fraction}")
    if not configs:
        raise ValueError("configs must hold at least one run")
    cfgs = []
    for c in configs:
        bad = set(c) - {"upload_fraction", "criterion", "threshold"}
        if bad or "upload_fraction" not in c:
            raise ValueError(f"a config takes upload_fraction, criterion, threshold; got {sorted(c)}")
        cfg = {"criterion": "largest", "threshold": 0.0, **c}
        select_upload(torch.zeros(1), cfg["upload_fraction"], cfg["criterion"], cfg["threshold"])  # validates
        cfgs.append(cfg)
    if isinstance(num_rounds, bool) or int(num_rounds) != num_rounds or num_rounds < 0:
        raise ValueError(f"num_rounds must be a non-negative integer, got {num_rounds}")
    num_rounds = int(num_rounds)
    data = clients if isinstance(clients, ClientData) else stack_clients(clients)
    w0 = {k: v.detach().clone() for k, v in (params or dict(model.named_parameters())).items()}
    gens = [torch.Generator().manual_seed(seed) for _ in cfgs]
    glob = [flatten_params(w0) for _ in cfgs]
    local = [[g.clone() for _ in range(data.num_clients)] for g in glob]
    hist = [History("accuracy", "loss") for _ in cfgs]
    from .protocols import eval_fn

    ev = eval_fn(model, eval_data, loss_fn)

    def log(t):
        if ev is not None:
            for h, g in zip(hist, glob):
                h.log(t, **ev(unflatten_params(g, w0)))

    log(0)
    for t in range(1, num_rounds + 1):
        for k in range(data.num_clients):
            Xk, yk = data.client(k)
            thetas, jobs = [], []
            for c, gen in enumerate(gens):
                down = torch.rand(glob[c].numel(), generator=gen) < download_fraction
                theta = torch.where(down, glob[c], local[c][k])
                idx, w = batch_plan(torch.tensor([len(Xk)]), batch_size, local_epochs, gen)
                thetas.append(theta)
                jobs.append(SGDJob(_expand(unflatten_params(theta, w0), 1), Xk.unsqueeze(0), yk.unsqueeze(0), idx, w,
                                   lr, single=True))
            for c, (theta, new) in enumerate(zip(thetas, sgd_jobs(model, jobs, loss_fn=loss_fn))):
                new_theta = flatten_params({n: v[0] for n, v in new.items()}).detach()
                delta = new_theta - theta
                mask = select_upload(delta, cfgs[c]["upload_fraction"], cfgs[c]["criterion"], cfgs[c]["threshold"],
                                     gens[c])
                glob[c] = glob[c] + torch.where(mask, delta, torch.zeros_like(delta))
                local[c][k] = new_theta
        log(t)
    return [FLResult(unflatten_params(g, w0), h) for g, h in zip(glob, hist)]
