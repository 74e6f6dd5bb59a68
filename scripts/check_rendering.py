#!/usr/bin/env python3
"""Look for what a reader would see broken in the built book (`make book` first): literal TeX that MathJax
did not typeset (a `$` or `\\(` left in the text), MyST roles or glue keys printed as text (`{glue:text}`,
`{cite}`, `{ref}`), Python reprs of float32 noise (`0.11999999731779099`), unresolved references (`??`), and
numbers out of the book's format: an interval on a constant (`1.000 ± 0.000`) or a t interval on a p-value.
Code, preformatted output, scripts and styles are left out: only the prose and tables a reader reads.

    python scripts/check_rendering.py [_build/html]      # exit 1 and one line per finding if any

Used by .ci/run after the strict build."""
from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path

SKIP = {"script", "style", "pre", "code", "kbd", "samp", "textarea"}
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
PATTERNS = {
    "literal TeX ($)": re.compile(r"(?<![\\\w])\$[^$\s][^$]{0,200}\$|\$\$"),
    "literal TeX (\\( or \\[)": re.compile(r"\\\(|\\\["),
    "a MyST role printed as text": re.compile(r"\{(glue(:\w+)?|cite(:\w+)?|ref|numref|eq|doc|term)\}`"),
    "a long float repr": re.compile(r"\b\d\.\d{12,}\b"),
    "an unresolved reference": re.compile(r"(?<!\?)\?\?(?!\?)"),
    # numbers in one sound format: a value equal at every seed has no interval, a p-value is a median and range
    "an interval on a constant (± 0)": re.compile(r"\d ± 0(?:\.0+)?(?:e[-+]?\d+)?(?![\d.]*[1-9])"),
    "an interval on a constant ([x, x])": re.compile(r"(?<![\d.])(\d+\.\d+) \[\1, \1\]"),
    # "p = 1.3e-03 ± 3.2e-03" in prose; in a table, see _P_VALUE (a row or a column labelled as p-values)
    "a t interval on a p-value": re.compile(r"(?i)\bp(?:-values?)?\s*[=≈<]\s*\d[\d.]*(?:e[-+]?\d+)?\s*±"),
}
_P_VALUE = re.compile(r"(?i)\bp-values?\b|^\s*p\s*$")


class _Text(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth = 0          # inside a skipped element (nesting counted)
        self.math = 0           # inside MathJax's source span (class "math")
        self.stack: list[tuple[str, bool, bool]] = []
        self.chunks: list[str] = []
        self.shown: list[str] = []   # also what code cells print (outputs are <pre>), scripts and styles left out
        self.tables: list[list[list[str]]] = []   # every table's rows, each a list of its cells' text
        self.row: list[str] | None = None
        self.cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag in VOID:
            return
        cls = dict(attrs).get("class") or ""
        skip = tag in SKIP
        math = "math" in cls.split()
        self.stack.append((tag, skip, math))
        self.depth += skip
        self.math += math
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.row = []
        elif tag in ("td", "th") and self.row is not None:
            self.cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None and self.row is not None:
            self.row.append(" ".join(" ".join(self.cell).split()))
            self.cell = None
        elif tag == "tr" and self.row is not None:
            self.tables[-1].append(self.row)
            self.row = None
        while self.stack:
            t, skip, math = self.stack.pop()
            self.depth -= skip
            self.math -= math
            if t == tag:
                break

    def handle_data(self, data):
        if self.cell is not None and not self.depth:
            self.cell.append(data)
        if not self.depth and not self.math:
            self.chunks.append(data)
        if not any(t in ("script", "style") for t, _, _ in self.stack):
            self.shown.append(data)


def findings(page: Path) -> list[str]:
    parser = _Text()
    parser.feed(page.read_text(encoding="utf-8", errors="replace"))
    prose, shown = " ".join(parser.chunks), " ".join(parser.shown)
    out = []
    for what, pattern in PATTERNS.items():
        text = shown if what == "a long float repr" else prose
        for m in pattern.finditer(text):
            lo, hi = max(m.start() - 40, 0), min(m.end() + 40, len(text))
            out.append(f"{page}: {what}: …{' '.join(text[lo:hi].split())}…")
    for rows in parser.tables:          # a t interval in a row, or under a column header, that holds p-values
        header = rows[0] if rows else []
        pcols = {i for i, cell in enumerate(header) if _P_VALUE.search(cell)}
        for row in rows[1:]:
            bad = [c for i, c in enumerate(row) if "±" in c and (i in pcols or (i > 0 and _P_VALUE.search(row[0])))]
            out += [f"{page}: a t interval on a p-value: …{' | '.join(row)[:160]}…" for _ in bad[:1]]
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "_build/html")
    pages = sorted(p for p in root.rglob("*.html") if "_static" not in p.parts and "_sources" not in p.parts
                   and p.name not in ("genindex.html", "search.html", "py-modindex.html"))
    if not pages:
        print(f"no built pages under {root}: run `make book` first", file=sys.stderr)
        return 2
    bad = [f for p in pages for f in findings(p)]
    for line in bad:
        print(line)
    print(f"{len(pages)} pages checked, {len(bad)} findings", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
