"""Issue 35, items 2, 3 and 5: one threat model per cell (the curious server under central DP sees the clipped
update before its own noise; the outsider who sees the noisy release is its own row group), one accountant for
central and local DP, and intervals inside each metric's range."""
import math
from html.parser import HTMLParser

import numpy as np
import pytest
import torch

from fedlab.experiments import matrix as mx
from fedlab import privacy
from fedlab.privacy import registry
from fedlab import fl
from fedlab import models
from fedlab.privacy import dp_fedavg as dpf
from fedlab.privacy import ldp
from fedlab.reproduce import summarize

KEYS = [d.key for d in mx.DEFENSES]
DP = [d.key for d in mx.DEFENSES if d.kind == "dp"]
_REAL_APPLY = registry.apply


def _spy(monkeypatch):
    """`privacy.apply` spied on: a list of ``(defense key, client_side_noise, input, output)`` per call."""
    calls = []

    def spy(updates, defense, **kw):
        out = _REAL_APPLY(updates, defense, **kw)
        key = defense if isinstance(defense, str) else defense.key
        calls.append((key, kw.get("client_side_noise", True), updates.clone(), out.clone()))
        return out

    monkeypatch.setattr(registry, "apply", spy)
    return calls


# ------------------------------------------------------------------------------------- one threat model per cell
def test_every_row_has_one_observer_and_the_outsiders_are_their_own_group():
    rows = {a.key: a for a in mx.ATTACKS}
    assert all(a.observer in mx.OBSERVERS for a in mx.ATTACKS)
    curious = [a for a in mx.ATTACKS if a.observer == "curious server"]
    outsiders = [a for a in mx.ATTACKS if a.observer == mx.OUTSIDER]
    assert {a.key for a in curious} == {"dlg", "ig", "mia", "rs", "oltr"}
    assert [a.key for a in outsiders] == [a.key + "_outsider" for a in curious]   # one outsider twin per row
    keys = [a.key for a in mx.ATTACKS]
    first = keys.index(outsiders[0].key)                                         # a contiguous group, before
    assert keys[first:first + len(outsiders)] == [a.key for a in outsiders]      # the SecAgg+ row's group (last)
    assert keys[first + len(outsiders):] == [a.key for a in mx.SECAGG_ROWS]
    for a in mx.ATTACKS:
        e = mx.effective_epsilons(a)
        # no outsider cell in a curious-server row: only an outsider sees central DP's noise (its epsilon)
        assert a.sees_central_noise == (a.observer == mx.OUTSIDER), a.key
        assert all(v is None for v in e["dp"].values()) == (a.observer != mx.OUTSIDER), (a.key, e)
    for o in outsiders:
        base = rows[o.key[:-len("_outsider")]]
        assert set(KEYS) - set(o.not_applicable) == set(mx.OUTSIDER_COLUMNS) and set(DP) <= set(mx.OUTSIDER_COLUMNS)
        assert (o.metric, o.higher_is_success, o.value_range, o.releases()) == (
            base.metric, base.higher_is_success, base.value_range, base.releases())
    with pytest.raises(ValueError, match="observer"):
        mx.Attack("x", "x", "x", "x", True, "x", lambda *a: {}, "x", observer="server")


@pytest.mark.parametrize("row", ["dlg", "mia", "oltr", "rs"])
@pytest.mark.slow   # > 2 s on one core (profile of 2026-11-27, quiet machine)
def test_central_dp_curious_server_cell_is_the_clip_only_view(monkeypatch, row):
    """Under DP-FedAvg the curious server's attack input is the clipped update, the clipping column's input,
    never the noisy release; its outsider twin's input carries the noise."""
    calls = _spy(monkeypatch)
    seen = []                                   # what the membership server records each round (the attack input)
    real_record = fl.RoundRecord

    def record(t, w, selected, updates, weights):
        seen.append(models.flatten_stacked(updates) - models.flatten_params(w))
        return real_record(t, w, selected, updates, weights)

    monkeypatch.setattr(fl, "RoundRecord", record)
    out = mx.run_row(row, 0, ["clip", "dp1"], tiny=True)
    dp_calls = [c for c in calls if c[0] == "dp1"]
    assert dp_calls and all(c[1] is False for c in dp_calls), row               # the pre-noise view
    if row != "mia":     # one round: the same update in both columns, and the same view of it
        (_, _, u_clip, v_clip), = [c for c in calls if c[0] == "clip"]
        (_, _, u_dp, v_dp), = dp_calls
        assert torch.equal(u_clip, u_dp) and torch.equal(v_clip, v_dp), row
    else:                # every round of the dp column: the server records exactly the clipped updates
        dp_rounds = seen[len(seen) // 2:]                                       # columns run in order: clip, dp1
        assert len(dp_rounds) == len(dp_calls)
        for rec, (_, _, u, v) in zip(dp_rounds, dp_calls):
            assert (v.norm(dim=1) <= v.norm(dim=1).max() * (1 + 1e-9)).all()
            assert torch.allclose(rec, v.to(rec.dtype), atol=1e-6), float((rec - v).abs().max())
    assert np.isfinite(out["dp1"])
    calls.clear()
    seen.clear()
    mx.run_row(row + "_outsider", 0, ["dp1"], tiny=True)
    dp_calls = [c for c in calls if c[0] == "dp1"]
    if row != "mia":     # the outsider's view: the clipped update plus the noise of the sum
        (_, noisy, u, v), = dp_calls
        assert noisy is True and not torch.allclose(v, privacy.apply(u, "dp1", client_side_noise=False, clip_norm=
                                                                  float(mx.median_norm(u))), atol=1e-6), row
    else:
        assert max(float((rec - v.to(rec.dtype)).abs().max()) for rec, (_, _, _, v) in zip(seen, dp_calls)) > 1e-3


@pytest.mark.slow   # > 2 s on one core (profile of 2026-11-27, quiet machine)
def test_dlg_under_central_dp_is_the_clip_aware_attack_on_the_clipping_cells_input():
    out = mx.run_row("dlg", 0, ["clip", "dp1", "dp8"], tiny=True)
    assert out["dp1"] == out["dp8"] == out["clip"], out                        # same input, same adaptive attacker
    assert out["dp1"] > out["baseline"] + 20 and "dp1" + mx.NAIVE_SUFFIX in out
    outsider = mx.run_row("dlg_outsider", 0, ["dp1"], tiny=True)
    assert outsider["dp1"] < out["baseline"] < out["dp1"] - 20, (outsider, out)


# ------------------------------------------------------------------------------------------------ one accountant
@pytest.mark.slow   # > 2 s on one core (profile of 2026-11-27, quiet machine)
def test_local_dp_epsilon_is_the_accountants_and_at_most_basic_composition():
    """The matrix's LDP epsilon of each row is what dp_accounting's privacy-loss-distribution accountant gives
    for the same Gaussian mechanism (noise multiplier sigma / (2C)) and release count, the accountant that also
    charges central DP, and never more than basic composition (k * eps)."""
    from dp_accounting import GaussianDpEvent, SelfComposedDpEvent
    from dp_accounting.pld import PLDAccountant

    e = mx.effective_epsilons("mia")
    k = e["releases"]
    for key, eps in (("ldp1", 1.0), ("ldp10", 10.0)):
        z = ldp.gaussian_sigma(eps, mx.LDP_DELTA, 2.0) / 2.0                  # sensitivity 2C, C = 1
        acc = PLDAccountant()
        acc.compose(SelfComposedDpEvent(GaussianDpEvent(z), k))
        assert e["ldp"][key] == pytest.approx(acc.get_epsilon(mx.LDP_DELTA), rel=2e-3), key
    assert e["ldp"]["ldp1"] < 5.45 < 30.0                                    # below RDP's 5.45 and basic composition's 30
    for a in mx.ATTACKS:
        e = mx.effective_epsilons(a)
        for d in mx.DEFENSES:
            if d.kind == "ldp":
                assert 0 < e["ldp"][d.key] <= e["releases"] * d.param * (1 + 1e-9), (a.key, d.key, e)
        if e["releases"] == 1:
            assert e["ldp"]["ldp10"] == pytest.approx(10.0, rel=1e-6)         # the calibration is exact for one release
    # central DP: the same accountant on DP-FedAvg's event; tighter than the RDP that calibrated z (the label)
    z = mx.dp_noise_multiplier(1.0)
    o = mx.effective_epsilons("mia_outsider")["dp"]["dp1"]
    acc = PLDAccountant()
    acc.compose(dpf.dp_event(z, 1.0, 30))
    assert o == pytest.approx(acc.get_epsilon(mx.DP_SETTING["delta"]), rel=1e-9)
    assert o < dpf.epsilon_spent(z, 1.0, 30, mx.DP_SETTING["delta"], safe=False)      # the float column's RDP
    dep = mx.deployment_epsilons()
    assert 0.8 < dep["dp1"] <= 1.0 and 6.0 < dep["dp8"] <= 8.0
    with pytest.raises(ValueError, match="releases"):
        mx.ldp_epsilon(1.0, 0)
    with pytest.raises(ValueError, match="epsilon"):
        mx.ldp_epsilon(-1.0, 3)
    with pytest.raises(ValueError, match="sampling_prob"):
        mx.central_epsilon(1.0, 1.5, 3, 1e-5)


# -------------------------------------------------------------------------------------- intervals inside the range
def test_bounded_interval_stays_in_range_and_holds_the_mean():
    assert mx.bounded_interval([0.9, 1.09], mx.UNIT) == [0.9, 1.0]
    assert mx.bounded_interval([-9.65, 19.2], mx.NONNEG) == [0.0, 19.2]
    assert mx.bounded_interval([-3.0, 70.0], (-math.inf, math.inf)) == [-3.0, 70.0]   # PSNR as is
    assert mx.bounded_interval(None, mx.UNIT) is None
    with pytest.raises(ValueError, match="ci"):
        mx.bounded_interval([1.0, 0.0], mx.UNIT)
    with pytest.raises(ValueError, match="value_range"):
        mx.bounded_interval([0.0, 1.0], (1.0, 1.0))


class _Intervals(HTMLParser):
    """The ``[low, high]`` under each cell of a rendered matrix, by row index."""

    def __init__(self):
        super().__init__()
        self.rows, self.text, self.body = [], None, False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.body = self.body or tag == "tbody"
        if tag == "tr" and self.body and a.get("class") != "mx-group":
            self.rows.append([])
        if tag == "td":
            self.text = ""

    def handle_data(self, data):
        if self.text is not None:
            self.text += data

    def handle_endtag(self, tag):
        if tag == "td" and self.text is not None:
            if self.rows and "[" in self.text:
                lo, hi = self.text[self.text.index("[") + 1:self.text.index("]")].split(",")
                self.rows[-1].append((float(lo), float(hi)))
            self.text = None


def test_rendered_intervals_stay_inside_the_metric_range_for_extreme_records():
    """A record with rates at 1 and 0 and errors near 0 (their t intervals leave the range): every interval
    the page prints lies in the row's range and holds the cell's mean; PSNR intervals are untouched."""
    values = {}
    for a in mx.ATTACKS:
        lo, hi = a.value_range
        values[mx.value_name(a.key, "baseline")] = [0.5, 0.5, 0.5] if hi == 1 else [1.0, 1.2, 0.9] if lo == 0 else [8.0, 8.5, 9.0]
        for k in KEYS:
            if k in a.not_applicable:
                continue
            if hi == 1:
                v = [1.0, 1.0, 0.7] if k in ("none", "clip") else [0.0, 0.0, 0.3]
            elif lo == 0:
                v = [1e-14, 2e-13, 1e-15] if k == "none" else [0.2, 0.1, 19.0]
            else:
                v = [60.0, 70.0, 20.0]
            values[mx.value_name(a.key, k)] = v
    rec = {"values": values, "summary": summarize(values), "seeds": [0, 1, 2], "matrix": mx.describe_matrix()}
    raw = [s["ci95"] for s in rec["summary"].values() if s["ci95"]]
    assert max(c[1] for c in raw) > 1 and min(c[0] for c in raw) < 0       # the t intervals do leave the range
    p = _Intervals()
    p.feed(mx.render_html(rec))
    assert len(p.rows) == len(mx.ATTACKS)
    for a, cells in zip(mx.ATTACKS, p.rows):
        lo, hi = a.value_range
        assert cells, a.key
        for c_lo, c_hi in cells:
            assert lo <= c_lo <= c_hi <= hi, (a.key, c_lo, c_hi)
        if math.isinf(lo):
            assert any(c_lo < 20 for c_lo, _ in cells)                           # PSNR: the plain t interval
    for a in mx.ATTACKS:
        for k in KEYS:
            if k not in a.not_applicable:
                ci = mx.cell_interval(rec, a.key, k)
                mean = rec["summary"][mx.value_name(a.key, k)]["mean"]
                assert ci[0] <= mean <= ci[1] and a.value_range[0] <= ci[0] and ci[1] <= a.value_range[1]
    with pytest.raises(ValueError, match="no summary"):
        mx.cell_interval(rec, "imprint", "dp1")
