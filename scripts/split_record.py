#!/usr/bin/env python
"""Split a stored record by key when its chapter is split into several notebooks (issue 39 item 3: chapter 1c
into 01c_membership_inference and 01d_membership_defenses).

    python scripts/split_record.py chapters/records/01c_membership_inference.paper.json \\
        --keys-from /tmp/quick 01c_membership_inference 01d_membership_defenses [--out chapters/records]

Each new notebook's keys are those of its record in ``--keys-from`` (``<stem>.<scale>.json`` of any scale, run
with ``python -m fedlab reproduce <stem> --scale quick --out DIR``, after checking that the split changed no
number). Every key of the stored record must be glued by exactly one new notebook; a key that a new notebook
glues and the stored record lacks (glued only since the record was made) is named and left out. Each part keeps
the record's seeds, commit, command, machine, date and ``seconds`` and gets its keys' ``values`` and ``summary``
unchanged, its own ``chapter`` and ``title``, and ``split_from``: the record it came from (chapter, commit,
date), the date of the split and a sentence saying that ``seconds`` are the whole unsplit chapter's.

Writes ``<out>/<stem>.<scale>.json`` for every part, atomically (:func:`fedlab.reproduce.atomic_write_text`),
and only once every part has been checked (a part that exists is replaced only with ``--force``). Exits 1 with
the reason, writing nothing, for a key in no part or in two, a part without keys, or a record with failures.
"""
from __future__ import annotations

import argparse
import copy
import datetime as _dt
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fedlab.records import load_record  # noqa: E402
from fedlab.reproduce import RECORD_FIELDS, atomic_write_text  # noqa: E402

SECONDS_NOTE = "seconds are those of the whole unsplit chapter, per seed, as it ran before the split"


def part_keys(keys_from: Path, stems: list[str]) -> dict[str, dict]:
    """``{stem: {"keys": set of glued names, "title": str}}`` from the records of ``stems`` in ``keys_from``
    (any scale). Raises ``ValueError`` for a stem with no record or two records of different keys."""
    out = {}
    for stem in stems:
        found = [load_record(p) for p in sorted(keys_from.glob(f"{stem}.*.json")) if not p.name.endswith(".failed.json")]
        if not found:
            raise ValueError(f"no record of {stem} in {keys_from} (run: python -m fedlab reproduce {stem} --scale "
                             f"quick --out {keys_from})")
        keysets = {frozenset(r["values"]) for r in found}
        if len(keysets) != 1:
            raise ValueError(f"the records of {stem} in {keys_from} glue different names")
        out[stem] = {"keys": set(found[0]["values"]), "title": found[0]["title"]}
    return out


def split_record(record: dict, parts: dict[str, dict], *, today: str | None = None) -> tuple[dict[str, dict], dict]:
    """The parts of ``record``, ``{stem: record}``, and a report ``{"new_only": {stem: [names]}}`` (names a part
    glues that the record lacks). ``parts``: :func:`part_keys`'s mapping. Raises ``ValueError`` for a record
    with failures, a key of the record in no part or in two, or a part that gets no key."""
    if record.get("failures"):
        raise ValueError(f"the record has failing seeds {[f['seed'] for f in record['failures']]}: split a clean one")
    owners = {k: [s for s, p in parts.items() if k in p["keys"]] for k in record["values"]}
    nowhere = sorted(k for k, o in owners.items() if not o)
    twice = sorted(k for k, o in owners.items() if len(o) > 1)
    if nowhere or twice:
        raise ValueError(f"every key must go to exactly one part; in none: {nowhere[:10]}; in several: {twice[:10]}")
    split_from = {"chapter": record["chapter"], "commit": record.get("commit"), "date": record.get("date"),
                  "split": today or _dt.date.today().isoformat(), "by": "scripts/split_record.py",
                  "seconds": SECONDS_NOTE}
    out = {}
    for stem, p in parts.items():
        mine = [k for k in record["values"] if owners[k] == [stem]]      # the record's order
        if not mine:
            raise ValueError(f"the part {stem} gets no key of the record")
        rec = copy.deepcopy(record)      # the record's fields in its order, then split_from
        rec.update(chapter=stem, title=p["title"], values={k: rec["values"][k] for k in mine},
                   summary={k: rec["summary"][k] for k in mine if k in rec["summary"]}, split_from=split_from)
        out[stem] = rec
    return out, {"new_only": {s: sorted(p["keys"] - set(record["values"])) for s, p in parts.items()}}


def write_parts(parts: dict[str, dict], out: Path, *, force: bool = False, source: Path | None = None) -> list[Path]:
    """Write every part to ``out/<stem>.<scale>.json`` (atomically), after checking that none exists unless
    ``force``; the part that replaces ``source`` (the unsplit record, when a part keeps its stem) goes last, so that
    a run stopped half-way leaves the unsplit record in place. Returns the paths in the order of ``parts``. Raises
    ``ValueError`` (writing nothing) for an existing part without ``force`` or a part that lacks a record field."""
    paths = {stem: out / f"{stem}.{rec['scale']}.json" for stem, rec in parts.items()}
    for stem, rec in parts.items():
        missing = [k for k in RECORD_FIELDS if k not in rec]
        if missing:
            raise ValueError(f"part {stem} lacks the fields {missing}")
        if paths[stem].exists() and not force:
            raise ValueError(f"{paths[stem]} exists: --force replaces it")
    last = source.resolve() if source is not None else None
    order = sorted(parts, key=lambda stem: paths[stem].resolve() == last)
    for stem in order:
        text = json.dumps(parts[stem], indent=1, ensure_ascii=False, allow_nan=False) + "\n"
        atomic_write_text(paths[stem], text)
    return [paths[stem] for stem in parts]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("record", type=Path, help="the stored record of the unsplit chapter")
    p.add_argument("stems", nargs="+", help="the notebooks it is split into")
    p.add_argument("--keys-from", type=Path, required=True, help="folder with a record of each new notebook")
    p.add_argument("--out", type=Path, default=None, help="folder to write the parts to (default: the record's)")
    p.add_argument("--force", action="store_true", help="replace parts that exist (the unsplit record's own "
                                                         "stem among them)")
    a = p.parse_args(argv)
    try:
        record = load_record(a.record)
        if record is None:
            raise ValueError(f"no record at {a.record}")
        parts, report = split_record(record, part_keys(a.keys_from, a.stems))
        paths = write_parts(parts, a.out or a.record.parent, force=a.force, source=a.record)
    except ValueError as exc:
        print(f"split_record: {exc}; nothing was written", file=sys.stderr)
        return 1
    for path, (stem, rec) in zip(paths, parts.items()):
        extra = report["new_only"][stem]
        print(f"{path}: {len(rec['values'])} keys, seeds {rec['seeds']}"
              + (f" (glued since the record, so not in it: {', '.join(extra)})" if extra else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
