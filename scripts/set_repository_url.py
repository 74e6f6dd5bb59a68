#!/usr/bin/env python3
"""Name the book's public git repository in every place that needs it (issue 22, item 7):

* ``_config.yml``: ``repository.url`` and ``branch``, the Binder and Colab launch buttons, the repository
  button (all empty / off while no repository is named, so the pages show no dead buttons);
* the first code cell of every chapter notebook (id ``colab-install``, tagged ``remove-cell``), which on
  Google Colab clones that repository and installs ``fedlab`` (:func:`fedlab.book.colab_cell_source`).

Usage::

    python scripts/set_repository_url.py https://github.com/OWNER/REPO [--branch main]
    python scripts/set_repository_url.py --check      # exit 1 if a notebook or the config disagrees

``binder/`` needs no URL: Binder builds from the repository it is launched from.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from fedlab.book import COLAB_CELL_ID, chapter_extras, colab_cell_source  # noqa: E402

BINDER, COLAB = "https://mybinder.org", "https://colab.research.google.com"


def chapter_notebooks(root: Path = ROOT) -> list[Path]:
    """The notebooks of ``_toc.yml`` (``chapters/*.ipynb`` listed there)."""
    toc = (root / "_toc.yml").read_text()
    return [root / f"{m}.ipynb" for m in re.findall(r"file:\s*(chapters/\S+)", toc) if (root / f"{m}.ipynb").is_file()]


def configured_url(root: Path = ROOT) -> str:
    """``repository.url`` of ``_config.yml`` ("" when none is named)."""
    m = re.search(r'^repository:\n  url: "([^"]*)"', (root / "_config.yml").read_text(), re.M)
    if m is None:
        raise ValueError("_config.yml has no `repository:` block whose first line is `  url: \"...\"`")
    return m.group(1)


def _set(text: str, key: str, value: str, quote: bool = True) -> str:
    new, n = re.subn(rf'^(  {key}: ).*$', lambda m: m.group(1) + (f'"{value}"' if quote else value), text,
                     count=1, flags=re.M)
    if n != 1:
        raise ValueError(f"_config.yml has no line `  {key}: ...`")
    return new


def write_config(url: str, branch: str, root: Path = ROOT) -> None:
    path = root / "_config.yml"
    text = path.read_text()
    text = _set(text, "url", url)
    text = _set(text, "branch", branch, quote=False)
    text = _set(text, "binderhub_url", BINDER if url else "")
    text = _set(text, "colab_url", COLAB if url else "")
    text = _set(text, "use_repository_button", "true" if url else "false", quote=False)
    path.write_text(text)


def colab_cell(url: str, stem: str = "") -> dict:
    return {"cell_type": "code", "execution_count": None, "id": COLAB_CELL_ID,
            "metadata": {"tags": ["remove-cell"]}, "outputs": [],
            "source": colab_cell_source(url, chapter_extras(stem)).splitlines(keepends=True)}


def write_notebook(path: Path, url: str) -> None:
    nb = json.loads(path.read_text())
    cells = [c for c in nb["cells"] if c.get("id") != COLAB_CELL_ID]
    first_code = next(i for i, c in enumerate(cells) if c["cell_type"] == "code")
    cells.insert(first_code, colab_cell(url, path.stem))
    nb["cells"] = cells
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def problems(root: Path = ROOT) -> list[str]:
    """Where the notebooks or the config disagree with ``repository.url`` (empty list: consistent)."""
    url = configured_url(root)
    out = []
    for path in chapter_notebooks(root):
        want = colab_cell_source(url, chapter_extras(path.stem))
        cells = json.loads(path.read_text())["cells"]
        code = [c for c in cells if c["cell_type"] == "code"]
        if not code or code[0].get("id") != COLAB_CELL_ID:
            out.append(f"{path.name}: the first code cell is not the Colab install cell")
        elif "".join(code[0]["source"]) != want or "remove-cell" not in code[0]["metadata"].get("tags", []):
            out.append(f"{path.name}: the Colab install cell is stale (run scripts/set_repository_url.py)")
    text = (root / "_config.yml").read_text()
    for key, value in (("binderhub_url", BINDER), ("colab_url", COLAB)):
        if f'  {key}: "{value if url else ""}"' not in text:
            out.append(f"_config.yml: {key} does not match repository.url")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url", nargs="?", help="https://github.com/OWNER/REPO ('' to unset)")
    ap.add_argument("--branch", default="main")
    ap.add_argument("--check", action="store_true", help="only check that every place agrees")
    args = ap.parse_args(argv)
    if args.check or args.url is None:
        found = problems()
        print("\n".join(found) or f"consistent: repository.url = {configured_url()!r}")
        return 1 if found else 0
    url = args.url.strip().rstrip("/")
    colab_cell_source(url)          # validates the URL
    write_config(url, args.branch)
    for path in chapter_notebooks():
        write_notebook(path, url)
    print(f"repository.url = {url!r} in _config.yml and {len(chapter_notebooks())} notebooks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
