"""Imports inside fedlab run one way: experiments, flower -> attacks -> fl -> privacy, data, models, metrics -> config, _checks.

Every import statement of every module (module level and inside functions) is checked, so a new
cycle fails here before it confuses a reader.
"""
import ast
from pathlib import Path


PKG = Path(__file__).resolve().parents[1] / "fedlab"

#: rank of each part of the package; a module may import only parts of lower or equal rank, except
#: that the parts of rank 1 are leaves towards each other as listed in SAME_RANK_FORBIDDEN, _checks,
#: _stats, _io and _parallel import nothing from fedlab, and records does not import book (book.setup uses records.Run)
RANK = {"config": 0, "_checks": 0, "_stats": 0, "_io": 0, "_parallel": 0, "privacy": 1, "data": 1, "models": 1, "metrics": 1,
        "optim": 1, "plots": 1, "fl": 2, "attacks": 3, "experiments": 4,
        # fedlab on Flower (issue 23): uses fl, data, models and attacks; nothing in fedlab imports it
        "flower": 4,
        # the page and command-line layer sits on top and may use everything
        "book": 5, "records": 5, "reproduce": 5, "__main__": 6, "__init__": 6}
SAME_RANK_FORBIDDEN = {"data": {"privacy", "models", "metrics"}, "models": {"privacy", "data", "metrics"},
                       "metrics": {"privacy", "data", "models"}, "config": set(), "_checks": {"config"},
                       "_stats": {"config", "_checks", "_io"}, "_io": {"config", "_checks", "_stats"},
                       "_parallel": {"config", "_checks", "_stats", "_io"},
                       "records": {"book"}}


def _part(module: str) -> str:
    """'fedlab.privacy.ldp' -> 'privacy'; 'fedlab' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path):
    """(line, imported fedlab module) for every import statement in ``path``."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "fedlab":
                    yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "fedlab":
                continue
            if node.module is None or target.count(".") == 0:   # "from . import x": x may be a submodule
                for a in node.names:
                    yield node.lineno, f"{target}.{a.name}"
            else:
                yield node.lineno, target


def _violations():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        src = _part(_module_name(path)) if _module_name(path) != "fedlab" else "__init__"
        if path.parent == PKG and path.stem not in ("__init__",):
            src = path.stem
        for line, target in _imports(path):
            dst = _part(target)
            if dst not in RANK or src not in RANK:
                bad.append(f"{path.relative_to(PKG.parent)}:{line} imports {target}: unknown part of fedlab")
            elif RANK[dst] > RANK[src] or dst in SAME_RANK_FORBIDDEN.get(src, set()) or (src == "config" and dst != "config"):
                bad.append(f"{path.relative_to(PKG.parent)}:{line} ({src}) imports {target} ({dst})")
    return bad


def test_imports_run_one_way():
    assert _violations() == []


def test_the_checker_sees_a_backward_import(tmp_path, monkeypatch):
    fake = tmp_path / "fedlab"
    (fake / "privacy").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "privacy" / "__init__.py").write_text("")
    (fake / "privacy" / "bad.py").write_text("def f():\n    from ..fl import fedavg\n")
    (fake / "data.py").write_text("from .privacy import bad\n")
    monkeypatch.setattr(__import__(__name__), "PKG", fake)
    found = _violations()
    assert any("privacy/bad.py:2" in v and "fedlab.fl" in v for v in found), found
    assert any("data.py:1" in v and "(data)" in v for v in found), found


RETIRED = {"max_norm": "clip_norm", "clip": "clip_norm", "num_iters": "max_iter", "max_evals": "max_iter",
           "num_steps": "local_steps or max_iter", "tolerance": "tol", "emb_dim": "dim", "embed_dim": "dim",
           "clip_items": "items_clip_norm", "clip_params": "params_clip_norm", "fcf_iters": "fcf_max_iter",
           "fncf_iters": "fncf_max_iter", "restarts": "num_restarts", "clip_radius": "clip_norm"}

#: The glossary as an allow-list: a public function's parameter whose name matches a concept's pattern must be one
#: of that concept's names, and a name tied to a part of fedlab (a path prefix) is allowed there only. A new
#: variant (``clip_bound``, ``n_restarts``, ``iters``) fails until it is added here on purpose, with its reason.
GLOSSARY = {
    "clip bound": (r"clip|radius", {
        "clip_norm": None, "items_clip_norm": None, "params_clip_norm": None,
        "clipping_norm": "fedlab/flower/",            # Flower's own name in its DP wrappers and run config
        "radius": "fedlab/privacy/dprivacy.py",       # d-privacy: the distance between two inputs, not a clip bound
        "attacker_knows_clip": None, "dp_client_clipping": None, "clipped_mean": None}),   # flags, a clipped mean
    "iteration budget": (r"iter|evals", {
        "max_iter": None, "fcf_max_iter": None, "fncf_max_iter": None, "decode_max_iter": None, "fit_max_iter": None,
        "criterion": None, "criteria": None}),       # 'iter' inside 'criterion': selection rules, not budgets
    "steps": (r"steps", {
        "local_steps": None,                          # a client's SGD steps
        "steps": "fedlab/",                           # calls of L-BFGS (DLG's reference loop)
        "ascent_steps": "fedlab/attacks/membership.py"}),
    "restarts": (r"restart", {"num_restarts": None, "restart": "fedlab/experiments/chapter1a.py"}),   # a result
    "rounds": (r"round", {
        "num_rounds": None, "rounds": None, "at_rounds": None, "after_round": None, "clients_per_round": None,
        "paper_rounds": None, "round": None, "round_timeout": "fedlab/flower/", "server_round": "fedlab/flower/"}),
    "epochs": (r"epoch", {
        "local_epochs": None, "num_epochs": None, "head_epochs": None, "final_head_epochs": None,
        "finetune_epochs": None, "local_only_epochs": None, "rep_epochs": None, "total_epochs": None,
        "epoch_sets": None}),
    "learning rate": (r"(^|_)lrs?$", {
        "lr": None, "lrs": None, "local_lr": None, "local_lrs": None, "server_lr": None, "user_lr": None,
        "fncf_lr": None, "ascent_lr": None, "ascent_lrs": None, "decode_lr": None, "fit_lr": None}),
    "privacy budget": (r"^eps|epsilon|_eps", {
        "epsilon": None, "epsilons": None, "eps_d": None, "floor_eps": None, "util_eps": None,
        "eps": "fedlab/experiments/"}),              # the chapters' sweeps and widgets; the library says epsilon
}


def _public_parameters(root):
    """``(path, line, function, parameter)`` of every parameter of every public function and method under
    ``root`` (a package directory)."""
    for path in sorted(root.rglob("*.py")):
        if "vendor" in path.parts:
            continue
        rel = path.relative_to(root.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                a = node.args
                for arg in a.posonlyargs + a.args + a.kwonlyargs:
                    yield rel, node.lineno, node.name, arg.arg


def _glossary_violations(root) -> list[str]:
    import re

    bad = []
    for rel, line, fn, name in _public_parameters(root):
        if name in RETIRED:
            bad.append(f"{rel}:{line} {fn}({name}=...) -> {RETIRED[name]}")
            continue
        for concept, (pattern, allowed) in GLOSSARY.items():
            if re.search(pattern, name):
                if name not in allowed:
                    bad.append(f"{rel}:{line} {fn}({name}=...): not a glossary name for {concept} {sorted(allowed)}")
                elif allowed[name] is not None and not rel.startswith(allowed[name]):
                    bad.append(f"{rel}:{line} {fn}({name}=...): allowed for {concept} only under {allowed[name]}")
    return bad


def test_public_signatures_use_the_glossary():
    """CONTRIBUTING.md's glossary, as an allow-list: every public parameter that names a clip bound, an
    iteration budget, steps, restarts, rounds, epochs, a learning rate or a privacy budget uses one of the
    names of :data:`GLOSSARY` (where a name is tied to a part of fedlab, only there); no retired name."""
    bad = _glossary_violations(PKG)
    assert not bad, "\n".join(bad)


def test_the_glossary_check_sees_a_new_variant(tmp_path):
    fake = tmp_path / "fedlab"
    (fake / "fl").mkdir(parents=True)
    (fake / "fl" / "a.py").write_text("def f(x, *, clip_bound=1.0, n_restarts=2, iters=3, lr=0.1, radius=1.0):\n"
                                      "    pass\n\ndef _private(clip_bound):\n    pass\n")
    found = _glossary_violations(fake)
    assert len(found) == 4, found       # clip_bound, n_restarts, iters, radius outside dprivacy; lr is fine
    assert any("clip_bound" in v and "clip bound" in v for v in found)
    assert any("radius" in v and "only under fedlab/privacy/dprivacy.py" in v for v in found)


def test_no_docstring_or_comment_cites_an_internal_issue():
    """The API reference is read by people who never saw this project's issue tracker: a docstring says what and
    why, with the paper and section, never "issue 35 item 2"."""
    import re

    pattern = re.compile(r"\bissues? #?\d+", re.I)
    hits = [f"{path.relative_to(PKG.parent)}:{i}: {line.strip()}"
            for path in sorted(PKG.rglob("*.py")) if "vendor" not in path.parts
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not hits, "\n".join(hits)


def test_fl_init_is_an_index():
    """``fedlab/fl/__init__.py`` only re-exports: FedAvg and the clients' training live in ``fl/protocols.py``
    and ``fl/local.py`` (every algorithm once), and ``fl.fedavg`` is that function."""
    tree = ast.parse((PKG / "fl" / "__init__.py").read_text())
    defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert defined == [], f"fl/__init__.py defines {defined}: put it in a module of fedlab.fl"
    from fedlab import fl
    from fedlab.fl import local, protocols
    assert fl.fedavg is protocols.fedavg and fl.client_update is local.client_update
    assert all(getattr(fl, name).__module__ in ("fedlab.fl.local", "fedlab.fl.protocols", "fedlab.fl.rounds")
               for name in fl.__all__)


def _long_signatures(root, limit: int = 10) -> dict[str, int]:
    """``{"module.function": parameters}`` of every public function or method under ``root`` (a package directory)
    with more than ``limit`` parameters (``self``, ``cls``, ``*args`` and ``**kwargs`` not counted)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        if "vendor" in path.parts or any(p.startswith("_") and p != "__init__.py" for p in path.relative_to(root).parts):
            continue
        mod = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                a = node.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
                if len(names) > limit:
                    out[f"{mod}.{node.name}"] = len(names)
    return out


def test_no_public_function_takes_more_than_ten_parameters():
    """Settings objects (``fl.LocalTraining``, ``gi.AttackBudget``, ``pac.Client``, ``rf.RaifleBudget``, ...) replace
    long parameter lists: no public function of fedlab takes more than 10 parameters (``self``/``cls`` not counted,
    keyword-only ones counted)."""
    found = _long_signatures(PKG)
    assert not found, f"over 10 parameters (group them into a settings object): {found}"


def test_the_parameter_count_sees_a_long_signature(tmp_path):
    fake = tmp_path / "fedlab"
    (fake / "fl").mkdir(parents=True)
    (fake / "fl" / "a.py").write_text("def f(a, b, c, d, e, f, g, h, i, j, *, k=1, **kw):\n    pass\n\n"
                                      "def g(self, a, b, c, d, e, f, g, h, i, j):\n    pass\n\n"
                                      "def _h(a, b, c, d, e, f, g, h, i, j, k):\n    pass\n")
    assert _long_signatures(fake) == {"fedlab.fl.a.f": 11}
