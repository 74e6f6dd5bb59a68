#!/usr/bin/env python3
"""How long a built page is, in screens, and what makes it long (`make book` first).

Each page is opened in headless Chromium at 1280 x 900 px (the width the book is checked at); after it has
loaded (and MathJax has typeset) the page's height is read and divided by 900 px: one "screen". Folded
material (a ``hide-input`` cell, a dropdown) counts as its title only, as a reader sees it first.

    python scripts/page_screens.py _build/html/chapters/02_pac_identifiability.html [...]   # screens per page
    python scripts/page_screens.py --blocks 25 _build/html/chapters/02_pac_identifiability.html

``--order`` lists every block in page order instead. ``--blocks N`` also lists the page's N tallest blocks (a code cell with its outputs, or the text between two
code cells or headings) with their height in px and their first words, tallest first. The issue "chapters that
fit a sitting" asks for at most about 20 screens a page. A temporary copy of the page is written next to it
(so its relative links to styles and scripts resolve) and removed afterwards."""
from __future__ import annotations

import argparse
import html
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

WIDTH, SCREEN = 1280, 900

# after load (and 3 s for MathJax and the widgets), write the page height and every block's extent into
# an attribute of <body>: the code cells (div.cell, outermost only) and the headings of the article
_JS = r"""<script>window.addEventListener("load",()=>setTimeout(()=>{
const art=document.querySelector("article")||document.body, y=e=>e.getBoundingClientRect().top+window.scrollY;
const items=[];
art.querySelectorAll("div.cell, h1, h2, h3").forEach(e=>{
  if(e.matches("div.cell")&&e.parentElement.closest("div.cell"))return;
  items.push({k:e.matches("div.cell")?"cell":"head",t:y(e),h:e.offsetHeight,
              s:(e.innerText||"").replace(/\s+/g," ").slice(0,90)});});
const a0=y(art), a1=a0+art.offsetHeight;
document.body.setAttribute("data-m",JSON.stringify({H:document.documentElement.scrollHeight,a0:a0,a1:a1,items:items}));
},3000))</script></body>"""


def measure(page: Path) -> dict:
    """The page's height and its blocks, from Chromium's DOM after load."""
    text = page.read_text(encoding="utf-8")
    fd, tmp = tempfile.mkstemp(prefix="._screens_", suffix=".html", dir=page.parent)
    os.close(fd)
    try:
        Path(tmp).write_text(text.replace("</body>", _JS, 1), encoding="utf-8")
        with tempfile.TemporaryDirectory() as profile:
            dom = subprocess.run(
                ["chromium", "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                 f"--window-size={WIDTH},{SCREEN}", "--virtual-time-budget=8000", "--dump-dom",
                 f"file://{Path(tmp).resolve()}"],
                capture_output=True, text=True, timeout=120).stdout
    finally:
        os.unlink(tmp)
    m = re.search(r'data-m="([^"]*)"', dom)
    if not m:
        raise RuntimeError(f"{page}: no measurement came back (did the page load?)")
    return json.loads(html.unescape(m.group(1)))


def blocks(m: dict) -> list[tuple[int, str, str]]:
    """(height px, kind, first words) of each code cell and of the text between two cells or headings, in page
    order; kind is "cell k" for the page's k-th code cell (0-based; cells tagged remove-cell are not on the
    page) or "text"."""
    out, prev_end, prev_s, k = [], m["a0"], "(top)", 0
    for it in sorted(m["items"], key=lambda it: it["t"]):
        gap = it["t"] - prev_end
        if gap > 40:
            out.append((round(gap), "text", f"after: {prev_s[:60]}"))
        if it["k"] == "cell":
            out.append((it["h"], f"cell {k}", it["s"]))
            k += 1
        prev_end, prev_s = max(prev_end, it["t"] + it["h"]), it["s"]
    if m["a1"] - prev_end > 40:
        out.append((round(m["a1"] - prev_end), "text", f"after: {prev_s[:60]}"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pages", nargs="+", type=Path)
    ap.add_argument("--blocks", type=int, default=0, metavar="N", help="also list the N tallest blocks")
    ap.add_argument("--order", action="store_true", help="list every block in page order instead")
    args = ap.parse_args(argv)
    for page in args.pages:
        m = measure(page)
        print(f"{page.name}: {m['H']} px = {m['H'] / SCREEN:.1f} screens")
        if args.blocks or args.order:
            bl = blocks(m) if args.order else sorted(blocks(m), reverse=True)[:args.blocks]
            for h, kind, s in bl:
                print(f"  {h:6d} px {h / SCREEN:4.1f} sc  {kind:8s}  {s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
