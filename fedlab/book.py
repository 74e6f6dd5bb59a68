"""Helpers for the book's pages, importing the notebook stack (myst-nb, IPython) only when called, so
that ``import fedlab`` works without it.

A chapter opens with one line of setup and keeps its bookkeeping out of sight::

    SEED, run = book.setup("02_pac_identifiability", threads=1)   # style, seed, scale line, record
    ...
    book.glue_many(honest_err=err, rounds=NUM_ROUNDS, digits=3)    # in a cell tagged remove-input
"""
from __future__ import annotations

import math
import numbers

__all__ = ["CHAPTER_EXTRAS", "COLAB_CELL_ID", "DEFAULT_EXTRAS", "chapter_extras", "colab_cell_source", "glue", "glue_many", "glue_paragraph", "Paragraph", "legend", "setup"]


def glue(name: str, value, display: bool = False) -> None:
    """myst-nb's ``glue`` (``display=False`` by default): the page quotes ``value`` as ``{glue:text}`name```
    and ``python -m fedlab reproduce`` collects it into the chapter's record. Raises ``ImportError``
    with the install hint when myst-nb is missing."""
    try:
        from myst_nb import glue as _glue
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("glue needs myst-nb: pip install 'fedlab-privacy-course[book]'") from exc
    _glue(name, value, display=display)


def _plain(name: str, value, digits: int | None):
    """``value`` as a Python ``int``/``float``/``str`` (numpy and 0-d torch scalars unwrapped), a float
    rounded to ``digits`` when given. Raises ``ValueError`` naming ``name`` for anything else and for a
    non-finite float (a page must not quote ``nan``)."""
    if isinstance(value, bool):
        raise ValueError(f"{name}: a boolean is not a number to quote; glue a string instead")
    if not isinstance(value, (numbers.Number, str)):
        try:
            value = value.item()
        except (AttributeError, ValueError, RuntimeError):
            raise ValueError(f"{name} must be a number or a string, got {type(value).__name__}") from None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"{name} is {value}: a page must not quote a non-finite number")
        return round(value, digits) if digits is not None else value
    if isinstance(value, str):
        return value
    raise ValueError(f"{name} must be a real number or a string, got {type(value).__name__}")


def glue_many(values: dict | None = None, *, digits: int | None = None, record: dict | None = None,
              **named) -> None:
    """Glue every ``name -> value`` of ``values`` and of the keyword arguments (``display=False``),
    floats rounded to ``digits`` decimals when given. With ``record`` (a :class:`fedlab.records.Run`
    or any dict) the glued values are also kept there. Returns ``None``, so that a call ending a
    cell prints nothing on the page. Raises ``ValueError`` naming the entry
    for a value that is not a finite number or a string, and for a name given twice."""
    values = dict(values or {})
    twice = set(values) & set(named)
    if twice:
        raise ValueError(f"names given twice: {sorted(twice)}")
    values.update(named)
    out = {str(k): _plain(str(k), v, digits) for k, v in values.items()}
    for k, v in out.items():
        glue(k, v)
    if record is not None:
        record.update(out)


class Paragraph(str):
    """A string that IPython shows as Markdown (``text/markdown``) as well as text (``text/plain``, the
    string's ``repr``, which :func:`fedlab.reproduce.collect_glued` reads back as the string)."""

    def _repr_markdown_(self) -> str:
        return str(self)


def glue_paragraph(**named) -> None:
    """Glue each ``name=text`` (a sentence or a paragraph computed by the page) as a :class:`Paragraph`, for
    ``{glue:md}`name``` in the text: it then reads as the surrounding prose. ``{glue:text}`` would set it in
    bold, myst-nb's style for a glued number, which marks a value, not a paragraph. Raises ``ValueError``
    naming an entry that is not a non-empty string, before anything is glued."""
    for name, text in named.items():
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{name}: a paragraph must be a non-empty string, got {text!r}")
    for name, text in named.items():
        glue(name, Paragraph(text))


def setup(stem: str | None = None, *, threads: int | None = None):
    """The first cell of a chapter: the book's plot style, every RNG seeded from ``FEDLAB_SEED``
    (:func:`fedlab.default_seed`), ``torch.set_num_threads(threads)`` when given (small tensors run
    fastest on one thread of a shared CPU), and one printed line with the scale and the seed.

    Returns ``SEED`` alone, or ``(SEED, run)`` when ``stem`` is given, ``run`` the chapter's
    :class:`fedlab.records.Run` (this build's glued numbers beside the stored paper-scale record).
    Raises ``ValueError`` for ``threads < 1``."""
    import torch

    from . import plots
    from .config import default_seed, scale, seed_everything

    if threads is not None:
        if int(threads) < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(int(threads))
    plots.use_style()
    seed = default_seed()
    seed_everything(seed)
    print(f"scale: {scale()} | seed: {seed}")
    if stem is None:
        return seed
    from .records import Run

    run = Run(stem)
    print(legend(run.record, scale(), seed))
    return seed, run


def legend(record: dict | None, scale: str, seed: int) -> str:
    """The line under every chapter's first cell that tells this build's numbers from the stored record's
    (the Notation page, "How numbers are shown", says it at length)."""
    if record is None:
        stored = "no paper-scale record is stored for this chapter yet"
    else:
        seeds = record.get("seeds", [])
        stored = (f"'mean ± half-width (n = k)' is the stored {record.get('scale', 'paper')}-scale record "
                  f"({len(seeds)} seed{'s' if len(seeds) != 1 else ''}, commit {record.get('commit') or '?'}, "
                  f"{record.get('date', '?')})")
    return (f"Numbers on this page: a plain number is this build's ({scale} scale, seed {seed}); {stored}; "
            "p-values over seeds are a median and range.")


#: The id of every chapter's first code cell, the Colab install cell (tagged ``remove-cell``).
COLAB_CELL_ID = "colab-install"
#: The extras of ``pyproject.toml`` a chapter needs beyond the core install: every chapter glues its numbers
#: through myst-nb (``book``); Chapters 6 and 6b run Flower (``flower``). Colab's install cell and Binder install them.
CHAPTER_EXTRAS = {"06_flower": ("book", "flower"), "06b_flower_secagg": ("book", "flower")}
DEFAULT_EXTRAS = ("book",)


def chapter_extras(stem: str) -> tuple[str, ...]:
    """The extras the chapter ``stem`` needs (:data:`CHAPTER_EXTRAS`, else :data:`DEFAULT_EXTRAS`)."""
    return CHAPTER_EXTRAS.get(stem, DEFAULT_EXTRAS)


def colab_cell_source(repository: str = "", extras: tuple[str, ...] = DEFAULT_EXTRAS) -> str:
    """The source of the first code cell of every chapter notebook: on Google Colab only, and only when
    ``fedlab`` is not importable, clone ``repository`` (the book's public git repository; written by
    ``scripts/set_repository_url.py``), ``pip install`` it (Colab's own torch satisfies the pin, so no
    torch download) and change into its ``chapters/`` folder so the stored records are found. Elsewhere
    the cell does nothing. With no repository named, the cell stops on Colab with an error that says
    how to name one. ``extras``: the ``pyproject.toml`` extras installed with it (:func:`chapter_extras`:
    ``book`` for every chapter, whose numbers are glued through myst-nb, and ``flower`` for Chapters 6 and 6b).
    Raises ``ValueError`` if ``repository`` is neither empty nor an ``https://`` URL, or for an extra that is
    not a plain name."""
    repository = str(repository).strip()
    if repository and (not repository.startswith("https://") or any(c in repository for c in "\"' \n")):
        raise ValueError(f"repository must be an https:// URL without quotes or spaces, got {repository!r}")
    extras = tuple(extras)
    if not all(isinstance(e, str) and e.isidentifier() for e in extras):
        raise ValueError(f"extras must be plain names such as 'book', got {extras!r}")
    target = "/content/fedlab-course" + (f"[{','.join(extras)}]" if extras else "")
    return (
        "# Google Colab only (hidden in the book; elsewhere this cell does nothing): fetch the book, install fedlab.\n"
        "import importlib.util, os, subprocess, sys\n"
        f"REPOSITORY = \"{repository}\"  # the book's public git repository: scripts/set_repository_url.py sets it\n"
        "if \"google.colab\" in sys.modules and importlib.util.find_spec(\"fedlab\") is None:\n"
        "    if not REPOSITORY:\n"
        "        raise RuntimeError(\"this copy of the book names no repository: run scripts/set_repository_url.py\")\n"
        "    subprocess.run([\"git\", \"clone\", \"--depth\", \"1\", REPOSITORY, \"/content/fedlab-course\"], check=True)\n"
        f"    subprocess.run([sys.executable, \"-m\", \"pip\", \"install\", \"--quiet\", \"{target}\"], check=True)\n"
        "    os.chdir(\"/content/fedlab-course/chapters\")  # the stored paper-scale records are found from here"
    )
