"""scripts/check_rendering.py finds what a reader would see broken on a built page, and only that."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("check_rendering", ROOT / "scripts" / "check_rendering.py")
cr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cr)

CLEAN = """<html><head><script>var s = "$x$ 0.11999999731779099";</script><style>.a{}</style></head><body>
<p>The bound <span class="math notranslate nohighlight">\\(x^2\\)</span> holds; costs 3 $ nowhere.</p>
<div class="math notranslate nohighlight">\\[\\sum_i x_i\\]</div>
<pre>$ make book
{glue:text}`key` in a code listing</pre><p>value 0.12, p = 1.5e-46, ratio 0.99953, 0.160 ± 0.009, 2 ± 0.01, 1.0 ± 0.05,
p-value median 0.02 (range 0.01-0.2, n = 5), AUC 0.7 ± 0.1</p><br><img src="a.png"></body></html>"""


def _page(tmp_path, body: str) -> Path:
    page = tmp_path / "page.html"
    page.write_text(body)
    return page


def test_a_clean_page_has_no_findings(tmp_path):
    assert cr.findings(_page(tmp_path, CLEAN)) == []
    assert cr.main(["x", str(tmp_path)]) == 0


def test_each_defect_is_found(tmp_path):
    cases = {
        "literal TeX ($)": "<p>the bound $\\rho_{\\min}$ printed raw</p>",
        "literal TeX (\\( or \\[)": "<p>the bound \\(x\\) printed raw</p>",
        "a MyST role printed as text": "<p>see {glue:text}`ch4-slope` here</p>",
        "a long float repr": "<pre>[0.12999999523162842, 0.14]</pre>",
        "an unresolved reference": "<p>see Section ?? above</p>",
        "an interval on a constant (± 0)": "<table><tr><td>2</td><td>1.000 ± 0.000</td></tr></table>",
        "an interval on a constant ([x, x])": "<p>AUC 1.000 [1.000, 1.000] (n = 5)</p>",
        "a t interval on a p-value": "<table><tr><th>quantity</th><th>record</th></tr>"
                                     "<tr><td>K-S p-value</td><td>1.34e-03 ± 3.24e-03</td></tr></table>",
    }
    for what, body in cases.items():
        found = cr.findings(_page(tmp_path, f"<html><body>{body}</body></html>"))
        assert len(found) == 1 and what in found[0], (what, found)
    assert cr.main(["x", str(tmp_path)]) == 1
    more = {   # the other forms of a t interval on a p-value: a column of p-values, prose, capitals
        "<table><tr><th>attack</th><th>P-value (record)</th></tr><tr><td>LDP</td><td>2e-03 ± 3e-03</td></tr></table>",
        "<p>the record gives p = 1.3e-03 ± 3.2e-03 over seeds</p>",
        "<table><tr><th>q</th><th>r</th></tr><tr><td>K-S p-value, mean over seeds</td><td>0.1 ± 0.2</td></tr></table>",
    }
    for body in more:
        found = cr.findings(_page(tmp_path, f"<html><body>{body}</body></html>"))
        assert len(found) == 1 and "p-value" in found[0], (body, found)


def test_a_p_value_beside_a_t_interval_of_something_else_is_fine(tmp_path):
    body = ("<table><tr><th>attack</th><th>K-S p-value</th><th>AUC (mean ± 95 % CI)</th></tr>"
            "<tr><td>LDP</td><td>median 2e-03 (range 1e-03–3e-03, n = 5)</td><td>0.61 ± 0.02 (n = 5)</td></tr></table>"
            "<table><tr><th>quantity</th><th>record</th></tr>"
            "<tr><td>K-S p-value</td><td>median 0.2 (range 0.1–0.3, n = 5)</td></tr>"
            "<tr><td>ADM</td><td>0.61 ± 0.02</td></tr></table><p>The p-value falls; AUC 0.61 ± 0.02.</p>"
            "<p>AUC 0.998 [0.995, 1.000]</p>")
    assert cr.findings(_page(tmp_path, f"<html><body>{body}</body></html>")) == []


def test_no_pages_is_an_error(tmp_path):
    assert cr.main(["x", str(tmp_path)]) == 2
