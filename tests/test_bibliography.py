"""The book's bibliography lists each work once, and every citation on a page names an entry.

The bibliography page prints every entry of every ``.bib`` file named in ``_config.yml`` (``:all:``), so a
work entered twice under two keys (chapter 3a once carried its own copy of Balle & Wang 2018) is printed twice.
"""
import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
ENTRY = re.compile(r"@(\w+)\{([^,\s]+),(.*?)\n\}", re.S)


def _entries():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    for name in config["bibtex_bibfiles"]:
        text = (ROOT / name).read_text(encoding="utf-8")
        for kind, key, body in ENTRY.findall(text):
            if kind.lower() in ("comment", "string", "preamble"):
                continue
            title = re.search(r"\btitle\s*=\s*[{\"](.*?)[}\"]\s*,?\s*\n", body, re.S)
            year = re.search(r"\byear\s*=\s*[{\"]?(\d{4})", body)
            yield name, key, title.group(1) if title else "", year.group(1) if year else ""


def _normal(title: str) -> str:
    return re.sub(r"[^a-z0-9]", "", title.lower())


def test_each_work_is_entered_once():
    seen: dict = {}
    dupes = []
    keys: dict = {}
    for name, key, title, year in _entries():
        assert key not in keys, f"key {key!r} in both {keys[key]} and {name}"
        keys[key] = name
        ident = (_normal(title), year)
        if ident[0] and ident in seen:
            dupes.append(f"{key} ({name}) repeats {seen[ident]}: {title!r} {year}")
        seen.setdefault(ident, f"{key} ({keys[key]})")
    assert not dupes, "\n".join(dupes)


def test_every_cited_key_has_an_entry():
    keys = {key for _, key, _, _ in _entries()}
    cited = set()
    pages = list((ROOT / "chapters").glob("*.ipynb")) + list((ROOT / "book").glob("*.md"))
    for page in pages:
        text = page.read_text(encoding="utf-8")
        if page.suffix == ".ipynb":
            text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"])
        for group in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", text):
            cited.update(k.strip() for k in group.split(","))
    missing = sorted(cited - keys)
    assert not missing, f"cited without an entry: {missing}"
