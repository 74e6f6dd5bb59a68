"""Helpers for the book's pages, importing the notebook stack (myst-nb, IPython) only when called, so
that ``import fedlab`` works without it."""
from __future__ import annotations

__all__ = ["glue"]


def glue(name: str, value, display: bool = False) -> None:
    """myst-nb's ``glue`` (``display=False`` by default): the page quotes ``value`` as ``{glue:text}`name```
    and ``python -m fedlab reproduce`` collects it into the chapter's record. Raises ``ImportError``
    with the install hint when myst-nb is missing."""
    try:
        from myst_nb import glue as _glue
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("glue needs myst-nb: pip install 'fedlab-privacy-course[book]'") from exc
    _glue(name, value, display=display)
