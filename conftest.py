"""Root conftest: loaded for `pytest tests/`, `pytest chapters/` and both together (tests/conftest.py holds
the fixtures)."""
import pytest


def pytest_collection_modifyitems(config, items):
    """Every cell nbval collects from a chapter notebook carries the ``notebook`` marker, so that
    ``-m "not notebook"`` (``make test-fast``) leaves the notebooks out."""
    for item in items:
        if str(getattr(item, "path", "")).endswith(".ipynb"):
            item.add_marker(pytest.mark.notebook)
