"""A reader's own defense in the attack x defense matrix (issue 35 item 6): ``run_row`` takes a user
:class:`~fedlab.experiments.matrix.Defense` (``kind="user"``, a function of the contract ``USER_CONTRACT``)
beside the library's keys; the attacker reads the public parameters the defense declares."""
import numpy as np
import pytest
import torch

from fedlab.experiments import matrix as mx
from fedlab import privacy
from fedlab.experiments.matrix import layout as mx_layout
from fedlab.privacy import defenses as pdef


def identity(updates, generator):
    return updates


def zero(updates, generator):
    return torch.zeros_like(updates)


def prune_public(updates, generator):
    view = pdef.prune_rows(updates, 0.9)
    return view, {"mask": view != 0}


def clip_public(updates, generator):
    C = mx.median_norm(updates)
    return pdef.clip_rows(updates, C), {"clip_norm": C}


def clip_secret(updates, generator):
    return pdef.clip_rows(updates, mx.median_norm(updates))


@pytest.mark.parametrize("row", ["imprint", "pac", "mia_active"])
def test_identity_defense_is_the_undefended_cell(row):
    res = mx.run_row(row, 0, ["none", mx.Defense("id", "identity", "user", fn=identity)], tiny=True)
    assert res["id"] == res["none"], res


def test_run_row_applies_the_user_defense():
    """A defense that sends nothing leaves the imprint attack nothing (the undefended attack recovers digits)."""
    res = mx.run_row("imprint", 0, ["none", mx.Defense("zero", "send nothing", "user", fn=zero)], tiny=True)
    assert res["none"] > 0.5 and res["zero"] == res["baseline"] == 0.0, res


def test_noisy_user_defense_uses_the_row_generator_and_is_reproducible():
    def noise(updates, generator):
        return updates + 1e-3 * updates.norm(dim=1, keepdim=True) * torch.randn(updates.shape, generator=generator,
                                                                               dtype=updates.dtype)
    d = mx.Defense("noise", "Gaussian noise", "user", fn=noise)
    torch.manual_seed(1)                    # the global stream differs between the runs, the row's does not
    a = mx.run_row("mr", 0, ["none", d])
    torch.manual_seed(2)
    b = mx.run_row("mr", 0, ["none", d])
    c = mx.run_row("mr", 1, ["none", d])
    # the same seed, the same noise (to the row's own float jitter, ~1e-16), another seed other noise
    assert a["noise"] == pytest.approx(b["noise"], rel=1e-9) and a["noise"] > 100 * a["none"], (a, b)
    assert c["noise"] != pytest.approx(a["noise"], rel=1e-3), (a, c)


@pytest.mark.slow   # > 2 s on one core (profile of 2026-11-27, quiet machine)
def test_user_defense_with_public_mask_gets_the_mask_aware_dlg():
    """The library's pruning written as a user defense that publishes its mask reproduces the library's cell,
    the mask-aware DLG and its naive twin bit for bit."""
    user = mx.Defense("myprune", "my pruning", "user", fn=prune_public, public=("mask",))
    lib = mx.run_row("dlg", 0, ["none", "prune90"], tiny=True)
    mine = mx.run_row("dlg", 0, ["none", user], tiny=True)
    assert mine["myprune"] == lib["prune90"] and mine["myprune@naive"] == lib["prune90@naive"], (lib, mine)
    assert mine["myprune"] > mine["myprune@naive"], mine
    assert mx.attacker("dlg", user).startswith("adaptive (reads mask)")


def test_user_defense_with_public_clip_norm_gets_the_clip_aware_eavesdropper():
    public = mx.Defense("myclip", "my clipping", "user", fn=clip_public, public=("clip_norm",))
    secret = mx.Defense("secret", "my clipping, C kept secret", "user", fn=clip_secret)
    res = mx.run_row("mr", 0, ["clip", public, secret])
    assert max(res["myclip"], res["clip"]) < 1e-6, res     # the library's clip-aware decoding: exact (to ~1e-13 jitter)
    assert res["secret"] > 1e3 * res["myclip"], res               # the naive decoding of the clipped messages
    assert mx.attacker("mr", public).startswith("adaptive") and mx.attacker("mr", secret).startswith("naive")
    assert mx.attacker("imprint", public).startswith("naive (this row's attack has no variant")


def _U():
    return torch.randn(4, 10, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


@pytest.mark.parametrize("fn, public, match", [
    (lambda U, g: U[:, :5], (), "shape"),
    (lambda U, g: U.float(), (), "dtype"),
    (lambda U, g: U * float("nan"), (), "NaN"),
    (lambda U, g: U.numpy(), (), "tensor"),
    (lambda U, g: (U, {}), (), "declares no public"),
    (lambda U, g: U, ("mask",), "must return"),
    (lambda U, g: (U, {"clip_norm": 1.0}), ("mask",), "public names"),
    (lambda U, g: (U, {"mask": torch.zeros_like(U, dtype=torch.bool)}), ("mask",), "not 0 where"),
    (lambda U, g: (U, {"mask": torch.ones(4, 9, dtype=torch.bool)}), ("mask",), "mask"),
    (lambda U, g: (U, {"clip_norm": 1e-3}), ("clip_norm",), "longer than"),
    (lambda U, g: (U, {"clip_norm": -1.0}), ("clip_norm",), "clip_norm"),
])
def test_contract_violations_are_value_errors(fn, public, match):
    d = mx.Defense("bad", "bad", "user", fn=fn, public=public)
    with pytest.raises(ValueError, match=match):
        privacy.apply_public(_U(), d)


def test_contract_violation_through_run_row():
    d = mx.Defense("bad", "bad", "user", fn=lambda U, g: U[:, :3])
    with pytest.raises(ValueError, match="defense 'bad'"):
        mx.run_row("imprint", 0, ["none", d], tiny=True)


def test_fn_gets_a_copy():
    U = _U()
    before = U.clone()

    def scribble(updates, generator):
        updates.zero_()
        return updates
    view, public = privacy.apply_public(U, mx.Defense("s", "s", "user", fn=scribble))
    assert torch.equal(U, before) and not view.any() and public == {}


def test_library_defenses_publish_their_parameters():
    U = _U()
    C = mx.median_norm(U)
    assert privacy.apply_public(U, "clip")[1] == {"clip_norm": C}
    v, p = privacy.apply_public(U, "prune90")
    assert torch.equal(p["mask"], v != 0) and int(p["mask"].sum()) == 4 * 1
    assert privacy.apply_public(U, "dp1", client_side_noise=False)[1] == {"clip_norm": C}
    assert privacy.apply_public(U, "dp1", generator=torch.Generator().manual_seed(0))[1] == {}
    assert torch.equal(privacy.apply_public(U, "none")[0], privacy.apply(U, "none"))


def test_bad_defenses_and_columns():
    with pytest.raises(ValueError, match="fn must be a callable"):
        mx.Defense("x", "x", "user")
    with pytest.raises(ValueError, match="kind must be"):
        mx.Defense("x", "x", "magic", fn=identity)
    with pytest.raises(ValueError, match="key must be"):
        mx.Defense("a|b", "x", "user", fn=identity)
    with pytest.raises(ValueError, match="key must be"):
        mx.Defense("a@naive", "x", "user", fn=identity)
    with pytest.raises(ValueError, match="public must be"):
        mx.Defense("x", "x", "user", fn=identity, public=("secret_key",))
    with pytest.raises(ValueError, match="for kind 'user' only"):
        mx.Defense("x", "x", "clip", fn=identity)
    with pytest.raises(ValueError, match="columns: user defense key 'clip'"):
        mx.run_row("imprint", 0, [mx.Defense("clip", "x", "user", fn=identity)], tiny=True)
    with pytest.raises(ValueError, match="columns: a key is given twice"):
        mx.run_row("imprint", 0, ["none", mx.Defense("x", "x", "user", fn=identity),
                                  mx.Defense("x", "y", "user", fn=zero)], tiny=True)
    with pytest.raises(ValueError, match="columns must be"):
        mx.run_row("imprint", 0, ["none", identity], tiny=True)
    with pytest.raises(ValueError, match="columns must be"):
        mx.run_row("imprint", 0, mx.Defense("x", "x", "user", fn=identity), tiny=True)
    with pytest.raises(ValueError, match="columns: a user defense runs on each client"):
        mx.run_row("dlg_outsider", 0, [mx.Defense("x", "x", "user", fn=identity)], tiny=True)
    with pytest.raises(ValueError, match="defense must be a user Defense"):
        mx.attacker("dlg", "prune90")
    # a library Defense object is its key; the user defenses do not outlive their run_row call
    assert mx.run_row("imprint", 0, [mx.DEFENSES[0]], tiny=True) == mx.run_row("imprint", 0, ["none"], tiny=True)
    mx.run_row("imprint", 0, [mx.Defense("later", "x", "user", fn=identity)], tiny=True)
    with pytest.raises(ValueError, match="defense must be one of"):
        mx_layout._defense("later")
    with pytest.raises(ValueError, match="defense must be one of"):
        privacy.apply(_U(), "later")                 # the library's registry knows only its own keys


def test_cell_takes_a_user_defense():
    f = mx.cell("imprint", mx.Defense("zero", "send nothing", "user", fn=zero), tiny=True)
    assert f(0) == 0.0 and np.isfinite(f(1))


def test_own_defense_table_shows_the_record_this_build_and_the_users_cell():
    rec = {"summary": {mx.value_name("imprint", "none"): {"mean": 0.85, "ci95": [0.7, 1.04], "n": 3}}}
    d = mx.Defense("q", "my defense", "user", fn=lambda u, g: u)
    t = mx.own_defense_table(rec, "imprint", d, {"none": 0.8, "q": 0.1}, 4).data
    assert "0.850 [0.700, 1.000]" in t and "| my defense, this build, seed 4 | 0.100 |" in t and "naive" in t
    with pytest.raises(ValueError, match="own"):
        mx.own_defense_table(rec, "imprint", d, {"none": 0.8}, 4)
