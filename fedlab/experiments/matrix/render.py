"""What the matrix's page (``chapters/07_matrix.ipynb``) shows of a record: the colour-coded HTML table
(:func:`render_html`), the threat-model tables (:func:`threat_rows`, :func:`row_threats`), the numbers it glues
(:func:`page_values`), the utility, adaptive-gap and own-defense tables (Markdown), and the table of cells a page
computes live (:func:`live_table`). The statistics behind them are in :mod:`fedlab.experiments.matrix.stats`."""
from __future__ import annotations

import html
from typing import Callable, Mapping

import numpy as np

from ..._stats import bounded_interval
from ...privacy.registry import DEFENSES, Defense, dp_noise_multiplier
from ._rows_gradient import IMPRINT_TOL
from .layout import _BY_KEY, LOSS_SUFFIX, LOSS_TRUTH_SUFFIX, NAIVE_NOTE, NAIVE_SUFFIX, OUTSIDER, value_name
from .rows import SECAGG_ROW, attacker
from .stats import (NOT_SIGNIFICANT, adaptive_gaps, advantage, cell_interval, metric_range, optimum_verdict,
                    record_table, undefended_advantage)

__all__ = ["COLUMN_NOTES", "threat_rows", "row_threats", "row_threat_header", "page_values", "own_defense_table",
           "UTILITY_ROW", "utility_table", "render_html", "adaptive_gap_table", "live_table"]


#: what a floating-point-safe column adds to its kind's note (the page's threat-model table)
_SAFE_NOTE = ("; floating-point-safe: the discrete Gaussian on a public grid (Canonne, Kamath & Steinke 2020) instead "
              "of float Gaussian noise, so the guarantee holds for the float output as well")


#: what each column changes in what the attacker sees (the page's threat-model table)
COLUMN_NOTES = {
    "none": "what the attack's chapter lets it see: each client's update (the server), each message (the eavesdropper)",
    "clip": "each client scales its update to L2 norm at most C, the median norm of the clean updates",
    "dp": "each client clips to C, a trusted server adds N(0, (zC)²) to the sum. The curious server that aggregates "
          "sees each clipped update before its own noise (the clip-only view, under the noisy training), and so "
          "does an eavesdropper on a client's link; only an outsider sees the noisy release (its own rows, below: it "
          "knows every other client's update, the adversary of the guarantee); a malicious server would not add "
          "the noise (n/a)",
    "ldp": "each client clips to C and adds the Gaussian noise of (ε, 1e-5)-LDP for sensitivity 2C, per release",
    "prune": "each client sends only the k largest coordinates of its update (top-k sparsification: pruning 90 % is "
             "top-k at k = 10 %); the zeros show the attacker which coordinates were sent",
    "secagg": "the attacker sees only the sum over a group of clients (masked messages, exact sum); against the "
              "malicious server inside SecAgg+ (its own row) the cell runs Flower's SecAgg+ itself",
    "consistency": "Flower's SecAgg+ with Bonawitz et al.'s consistency round: each client signs the survivor set and "
                   "the model it received and refuses to reveal key shares when another client saw something else "
                   "(a column of the malicious-server-in-SecAgg+ row only)",
    "dpriv": "each client adds Euclidean Laplace noise with E‖ρ‖ = ν ‖update‖ (Galli et al., Algorithm 2)",
}


def threat_rows(record: Mapping | None = None) -> list[list[str]]:
    """Rows ``[column, what the attacker sees]`` of the page's threat-model table, one per column of
    :data:`DEFENSES` (DP columns with their noise multiplier ``z`` from ``record``'s layout when given,
    else from :func:`dp_noise_multiplier`)."""
    zs = (record or {}).get("matrix", {}).get("dp_noise_multipliers") or {}
    rows = []
    for d in DEFENSES:
        note = COLUMN_NOTES[d.kind]
        if d.safe:
            note = note + _SAFE_NOTE
        if d.kind == "dp":
            z = zs.get(d.key, dp_noise_multiplier(d.param))
            note = f"z = {z:.3f}: " + note
        rows.append([d.label, note])
    return rows


def row_threats(record: Mapping) -> list[list[str]]:
    """Rows of the page's per-attack threat table, from a record's layout: ``[attack, secure-aggregation
    group, releases observed, effective epsilon of each DP-FedAvg column, LDP epsilon composed over the
    releases]`` (see :func:`effective_epsilons`). Raises ``ValueError`` for a record without the layout."""
    layout = record.get("matrix") if isinstance(record, Mapping) else None
    if not layout:
        raise ValueError("record is not a matrix record (no 'matrix' layout)")
    out = []
    for r in layout["rows"]:
        e = r["epsilons"]
        obs = str(e["releases"]) if e["sampling_prob"] == 1 else f'{e["releases"]} ({e["rounds"]} rounds × q = {e["sampling_prob"]:g})'
        dp = ["n/a" if k in r["not_applicable"] else "none" if v is None else f"{v:.3g}" for k, v in e["dp"].items()]
        if "none" in dp and set(dp) <= {"none", "n/a"}:     # no guarantee in any cell that exists
            dp = [_NO_GUARANTEE.get(r.get("observer"), "none: the attacker sees the update before the noise")]
        group = "n/a" if "secagg" in r["not_applicable"] else str(r["secagg_group"])
        out.append([r["label"], group, obs, " / ".join(dp),
                    " / ".join(f"{v:.3g}" if v < 1000 else f"{v:,.0f}" for v in e["ldp"].values())])
    return out


#: why central DP guarantees nothing against an observer before the noise (the threat table's text)
_NO_GUARANTEE = {"curious server": "none: the server sees each clipped update before the noise it adds",
                 "eavesdropper": "none: the noise is added after the tapped link"}


def row_threat_header(record: Mapping) -> list[str]:
    """The header of :func:`row_threats`' table (column labels from the record's layout)."""
    cols = {c["key"]: c["label"] for c in record["matrix"]["columns"]}
    first = record["matrix"]["rows"][0]["epsilons"]
    dp = " / ".join(cols[k] for k in first["dp"])
    ldp = " / ".join(cols[k] for k in first["ldp"])
    return ["attack", "secure-aggregation group", "releases observed",
            f"effective ε of {dp}", f"{ldp}, composed over the releases (same accountant)"]


def page_values(record: Mapping) -> dict:
    """The numbers the page quotes from a matrix record, ``{name: value}``: every cell's mean as
    ``mx_<row>_<column>`` (dots in keys become ``p``), the baselines, the DP noise multipliers, the
    number of seeds, the wall seconds (total, mean per seed, slowest row per seed) and the machine, each
    row's secure-aggregation group (``mx_group_<row>``), releases observed and effective DP-FedAvg epsilons
    (``mx_eps_<row>_<column>``), the eavesdropper's cells in scientific notation (``mx_mr_<column>_sci``),
    each mask-aware cell's optimum check as a phrase (``mx_<row>_<column>_optimum``, :func:`optimum_verdict` of
    the means of its ``@loss`` and ``@loss_truth``), :data:`IMPRINT_TOL`, the sentence naming the rows without a
    significant undefended advantage and the rows run again since the record's commit (``mx_reruns``; "every row at that commit" when none).
    Raises ``ValueError`` for a record without the matrix layout."""
    if not record or "matrix" not in record:
        raise ValueError("record is not a matrix record (no 'matrix' layout)")
    tag = lambda k: k.replace(".", "p").replace("@", "_")   # noqa: E731
    out = {f"mx_{tag(n.replace('|', '_'))}": s["mean"] for n, s in record["summary"].items()}
    out.update({f"mx_z_{tag(k)}": z for k, z in record["matrix"]["dp_noise_multipliers"].items()})
    secs = record["seconds"]
    slow = max(record["row_seconds"], key=lambda r: np.mean([x for x in record["row_seconds"][r] if x is not None]))
    for r in record["matrix"]["rows"]:
        out[f"mx_group_{r['key']}"] = r["secagg_group"]
        out[f"mx_releases_{r['key']}"] = r["epsilons"]["releases"]
        out.update({f"mx_eps_{r['key']}_{k}": v for k, v in r["epsilons"]["dp"].items() if v is not None})
        out.update({f"mx_eps_{r['key']}_{k}": v for k, v in r["epsilons"]["ldp"].items()})
    out.update({f"mx_eps_deploy_{k}": v for k, v in (record["matrix"].get("dp_deployment_epsilons") or {}).items()})
    out.update({f"mx_{tag(n.replace('|', '_'))}_sci": f"{s['mean']:.1e}" for n, s in record["summary"].items()
                if n.startswith("mr|")})                                 # ~1e-14: not 0.0 at 3 digits
    flat = [r["label"] for r in record["matrix"]["rows"] if not undefended_advantage(record, r["key"])["significant"]]
    out["mx_not_significant"] = ("every row has a significant undefended advantage at this scale" if not flat else
                                 f"{' and '.join(flat)}: {NOT_SIGNIFICANT}; its row is not coloured")
    for n, st in record["summary"].items():            # each mask-aware cell's optimum check, as a phrase
        if n.endswith(LOSS_SUFFIX) and n[:-len(LOSS_SUFFIX)] + LOSS_TRUTH_SUFFIX in record["summary"]:
            truth = record["summary"][n[:-len(LOSS_SUFFIX)] + LOSS_TRUTH_SUFFIX]["mean"]
            out[f"mx_{tag(n[:-len(LOSS_SUFFIX)].replace('|', '_'))}_optimum"] = optimum_verdict(st["mean"], truth)
    out["mx_imprint_tol"] = IMPRINT_TOL
    out.update(mx_seeds=len(record["seeds"]), mx_wall_s=float(sum(secs)), mx_seed_s=float(np.mean(secs)),
               mx_slowest_row=next((r["label"] for r in record["matrix"]["rows"] if r["key"] == slow), slow),
               mx_slowest_s=float(np.mean(record["row_seconds"][slow])),
               mx_machine=str(record.get("machine", "?")), mx_commit=str(record.get("commit", "?")),
               mx_reruns="; ".join(f"rows {', '.join(r.get('rows', []))} run again at commit {r.get('commit', '?')} "
                                   f"({r.get('date', '?')}, {r.get('machine', '?')})"
                                   for r in record.get("reruns") or []) or "every row at that commit")
    return out


def own_defense_table(record: Mapping, row: str, defense: "Defense", own: Mapping, seed: int):
    """Page 07's "Add your own defense" table (Markdown): the stored undefended cell of ``row`` (mean and
    :func:`cell_interval` over the record's seeds), this build's undefended cell and the ``defense`` cell
    from ``own`` (what :func:`run_row` returned for ``["none", defense]`` at ``seed``), with the attacker
    each cell had (:func:`attacker`). Raises ``ValueError`` when the record lacks the cell or ``own`` a value."""
    from ...plots import md_table

    stored = (record.get("summary") or {}).get(value_name(row, "none"))
    if stored is None or "none" not in own or defense.key not in own:
        raise ValueError(f"own_defense_table needs the record's {row}|none cell and own['none'], own[{defense.key!r}]")
    lo, hi = cell_interval(record, row, "none")
    return md_table(
        [f"{row} row", "value", "attacker"],
        [[f"no defense, stored record ({stored['n']} seeds)", f"{stored['mean']:.3f} [{lo:.3f}, {hi:.3f}]", "the row's attack"],
         [f"no defense, this build, seed {seed}", f"{own['none']:.3f}", "the row's attack"],
         [f"{defense.label}, this build, seed {seed}", f"{own[defense.key]:.3f}", attacker(row, defense)]])


#: the row whose training gives every column's utility (its FedAvg run under each column: ``"mia|acc_<column>"``)
UTILITY_ROW = "mia"


def utility_table(record: Mapping):
    """Page 07's utility table (Markdown): for every column of :data:`DEFENSES`, the test accuracy of the global
    model that the passive membership row (:data:`UTILITY_ROW`: 10 clients, the 64-64-10 MLP, FedAvg for
    Chapter 1c's rounds) trains under that column, from the record's ``"mia|acc_<column>"`` (mean and
    :func:`cell_interval` over its seeds). A column the record does not hold yet reads "not in the stored record
    yet"; the consistency round (kind ``consistency``) changes no sum, so its utility is secure aggregation's.
    Raises ``ValueError`` for a record without the matrix layout or without the undefended accuracy."""
    from ...plots import md_table

    summ = record.get("summary") if isinstance(record, Mapping) else None
    if not record or "matrix" not in record or not summ:
        raise ValueError("record is not a matrix record (no 'matrix' layout)")
    if value_name(UTILITY_ROW, "acc_none") not in summ:
        raise ValueError(f"the record holds no {UTILITY_ROW}|acc_none: no utility to show")
    rows = []
    for d in DEFENSES:
        key = "secagg" if d.kind == "consistency" else d.key
        s = summ.get(value_name(UTILITY_ROW, f"acc_{key}"))
        if s is None:
            rows.append([d.label, "not in the stored record yet", "—"])
            continue
        lo, hi = cell_interval(record, UTILITY_ROW, f"acc_{key}")
        same = " (secure aggregation's: the consistency round changes no sum)" if key != d.key else ""
        rows.append([d.label, f"{s['mean']:.3f} [{lo:.3f}, {hi:.3f}]{same}", str(s["n"])])
    return md_table(["defense (column)", "test accuracy of the trained model", "seeds"], rows)


def _fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.2e}"


def _colour(share: float) -> str:
    """White-ish green (0: at the baseline) to red (1: as strong as undefended)."""
    lo, hi = np.array([220, 240, 220]), np.array([235, 120, 110])
    r, g, b = (lo + share * (hi - lo)).round().astype(int)
    return f"rgb({r},{g},{b})"


#: the header of a row group (a ``<tr class="mx-group">`` above its first row), by observer
_ROW_GROUPS = {OUTSIDER: "Outsider who sees only the released aggregate (and, as the DP guarantee assumes, every other "
                         "update): the same attacks as the curious-server rows above, under central DP's noise",
               SECAGG_ROW: "Malicious server inside secure aggregation, computed through Flower's SecAgg+ (Chapter 6b): "
                           "stock SecAgg+ against SecAgg+ with the consistency round"}


def render_html(record: Mapping, *, chapter_link: Callable[[str], str] | None = None) -> str:
    """The colour-coded HTML table of a matrix record: one ``<tr>`` per attack, one column per defense,
    each cell ``mean`` over ``[lo, hi]`` (the 95 % t interval over the seeds cut to the metric's range,
    :func:`cell_interval`), coloured by :func:`advantage`
    of the mean against the row's baseline mean and the undefended mean; n/a cells grey with the reason as
    tooltip and as a numbered note under the table. A row whose undefended advantage over the baseline is
    not significant (:func:`undefended_advantage`) is rendered neutral (class ``mx-neutral``, no share)
    with the note :data:`NOT_SIGNIFICANT`; a cell with a note of its row's ``cell_notes`` carries it as a
    numbered note. Each row header links to its chapter
    (``chapter_link(stem)``, default ``"<stem>.html"``) and states the metric, its direction, the
    baseline and the threat model. The outsider rows (:data:`OUTSIDER_ROWS`) come under a group header
    (``<tr class="mx-group">``). Raises ``ValueError`` for a record without the matrix layout."""
    rows = record_table(record)
    link = chapter_link or (lambda stem: f"{stem}.html")
    cols = record["matrix"]["columns"]
    notes: list[str] = []
    cell_css = "padding:3px 4px;text-align:center;min-width:5.2em;border:1px solid #fff;font-size:1em"
    head = "".join(f'<th style="{cell_css};font-weight:600">{html.escape(c["label"])}</th>' for c in cols)
    body = []

    def note_mark(text: str) -> str:
        if text not in notes:
            notes.append(text)
        return f"<sup>{notes.index(text) + 1}</sup>"

    groups_seen = set()
    for r in rows:
        row = r["row"]
        base = r["baseline"]
        group = _ROW_GROUPS.get(row["key"]) or _ROW_GROUPS.get(row.get("observer"))
        if group and group not in groups_seen:
            groups_seen.add(group)
            body.append(f'<tr class="mx-group"><th colspan="{len(cols) + 1}" style="text-align:left;padding:6px 6px 3px;'
                        f'border-top:2px solid #888">{html.escape(group)}</th></tr>')
        none = r["cells"].get("none")
        try:
            significant = undefended_advantage(record, row["key"])["significant"]
        except ValueError:
            significant = True
        row_mark = "" if significant else note_mark(NOT_SIGNIFICANT)
        cell_notes = row.get("cell_notes") or {}
        arrow = "↑" if row["higher_is_success"] else "↓"
        base_txt = "—" if not base else _fmt(base["mean"])
        href, label = html.escape(link(row["chapter"])), html.escape(row["label"])
        tds = [f'<th style="text-align:left;font-weight:normal;min-width:17em;padding:3px 6px">'
               f'<a href="{href}"><b>{label}</b></a>{row_mark}<br><span style="font-size:0.9em">{html.escape(row["metric"])} {arrow} = success; '
               f'baseline {base_txt} ({html.escape(row["baseline"])})<br><i>{html.escape(row["threat"])}</i>'
               f'</span></th>']
        for c in cols:
            s = r["cells"][c["key"]]
            if s is None:
                tds.append(f'<td class="mx-missing" style="{cell_css};background:#fff">missing</td>')
            elif "na" in s:
                mark = note_mark(s["na"])
                tds.append(f'<td class="mx-na" style="{cell_css};background:#d0d0d0" title="{html.escape(s["na"])}">'
                           f'n/a{mark}</td>')
            else:
                ci = bounded_interval(s.get("ci95"), metric_range(record, row["key"]))
                interval = f'<br><span style="font-size:0.85em">[{_fmt(ci[0])}, {_fmt(ci[1])}]</span>' if ci else ""
                extra = cell_notes.get(c["key"])
                mark = note_mark(extra) if extra else ""
                tail = f"; {extra}" if extra else ""
                if significant:
                    share = (advantage(s["mean"], base["mean"], none["mean"])
                             if base and none and "mean" in none else 0.0)
                    cls, bg = "mx-cell", _colour(share)
                    title = f"{share:.0%} of the undefended advantage over the baseline; n = {s['n']} seeds{tail}"
                else:
                    cls, bg = "mx-cell mx-neutral", "#f2f2f2"
                    title = f"{NOT_SIGNIFICANT}; n = {s['n']} seeds{tail}"
                naive = record.get("summary", {}).get(value_name(row["key"], c["key"] + NAIVE_SUFFIX))
                naive_txt = ""
                if naive and "mean" in naive:
                    naive_txt = (f'<br><span class="mx-naive" style="font-size:0.85em">naive {html.escape(_fmt(naive["mean"]))}'
                                 f'{note_mark(NAIVE_NOTE)}</span>')
                tds.append(f'<td class="{cls}" style="{cell_css};background:{bg}" title="{html.escape(title)}">'
                           f'{html.escape(_fmt(s["mean"]))}{mark}{interval}{naive_txt}</td>')
        body.append("<tr>" + "".join(tds) + "</tr>")
    foot = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return ('<div style="overflow-x:auto"><table class="fedlab-matrix" '
            'style="font-size:0.72em;border-collapse:collapse;line-height:1.25">'
            f'<thead><tr><th style="{cell_css}">attack \\ defense</th>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>"
            + (f'<ol class="mx-notes" style="font-size:0.8em">{foot}</ol>' if notes else ""))


def adaptive_gap_table(record: Mapping):
    """Page 07's table of :func:`adaptive_gaps` (Markdown): each cell with a naive twin, the attacker who knows the
    defense (mean [interval]) beside the naive one, their paired difference with its 95 % interval, and whether
    the naive number lies outside the cell's interval. Raises ``ValueError`` for a record without the layout."""
    from ...plots import md_table

    labels = {d.key: d.label for d in DEFENSES}
    row_labels = {r["key"]: r.get("label", r["key"]) for r in (record.get("matrix") or {}).get("rows", [])}
    rows = []
    for g in adaptive_gaps(record):
        lo, hi = g["interval"]
        ci = g["difference_ci95"]
        diff = f"{_fmt(g['difference'])}" + (f" [{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else "")
        rows.append([row_labels.get(g["row"], g["row"]), labels.get(g["column"], g["column"]),
                     f"{_fmt(g['adaptive']['mean'])} [{_fmt(lo)}, {_fmt(hi)}]", _fmt(g["naive"]["mean"]), diff,
                     "yes" if g["beyond"] else "no", str(g["adaptive"]["n"])])
    return md_table(["attack", "defense", "attacker who knows it", "naive attacker", "difference (paired)",
                     "naive outside the interval", "seeds"], rows)


def live_table(rows: Mapping[str, Mapping[str, float]], *, digits: int = 3) -> str:
    """A Markdown table of cells a page computes live with :func:`run_row`: one line per ``label -> cells``
    (``{column key: value}`` as ``run_row`` returns it), one column per defense in :data:`DEFENSES` order
    (headed by its label), the attack's ``baseline`` first; ``acc_<column>`` values (the membership row's test
    accuracy) go to a line of their own, ``<label>: test accuracy``; ``@``-suffixed values (naive twins, a
    cell's parts) are left out. Values to ``digits`` significant digits; "–" where a line has no such cell
    (:func:`fedlab.plots.md_table`). Raises ``ValueError`` for no rows."""
    from ...plots import md_table

    if not rows:
        raise ValueError("rows must hold at least one label -> cells")
    lines: dict[str, dict] = {}
    for label, cells in rows.items():
        lines[label] = {k: v for k, v in cells.items() if "@" not in k and not k.startswith("acc_")}
        acc = {k[4:]: v for k, v in cells.items() if k.startswith("acc_") and "@" not in k}
        if acc:
            lines[f"{label}: test accuracy"] = acc
    used = {k for cells in lines.values() for k in cells}
    keys = (["baseline"] if "baseline" in used else []) + [d.key for d in DEFENSES if d.key in used]
    keys += sorted(used - set(keys))
    head = ["", *("the attack's baseline" if k == "baseline" else _BY_KEY[k].label if k in _BY_KEY else k
                  for k in keys)]
    return md_table(head, [[f"{label}", *(f"{cells[k]:.{digits}g}" if k in cells else "–" for k in keys)]
                           for label, cells in lines.items()])
