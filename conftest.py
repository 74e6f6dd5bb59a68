"""Root conftest: loaded for `pytest tests/`, `pytest chapters/` and both together (tests/conftest.py holds
the fixtures).

Two jobs:

* every cell nbval collects from a chapter notebook carries the ``notebook`` marker, so that
  ``-m "not notebook"`` (``make test-fast``) leaves the notebooks out;
* with ``--keep-executed DIR`` (``make test`` passes ``_build/executed``) a notebook whose every code cell ran
  and passed under nbval is also stored, executed, in ``DIR`` with its fingerprint
  (``scripts/executed_store.py``), so that `make book` right after does not execute it again. The executed
  notebook is rebuilt from the very kernel messages nbval reads, by nbclient's own message handling (outputs,
  display updates, widget state), so it is what ``scripts/execute_notebooks.py`` would have written.
"""
import copy
from pathlib import Path

import pytest


def pytest_addoption(parser):
    parser.addoption("--keep-executed", metavar="DIR", default=None,
                     help="store every notebook that passed under nbval, executed, in DIR for `make book`")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if str(getattr(item, "path", "")).endswith(".ipynb"):
            item.add_marker(pytest.mark.notebook)
    # Order for `make test` (pytest-xdist, --dist loadfile hands out whole files in this order): the notebooks
    # first, then the test files with the most `slow` or `flower` tests (test_reproduce, test_matrix, ...),
    # then the rest in their usual order. Collected alphabetically, test_reproduce (~100 s) came near the end
    # and ran alone on one worker while the other idled. A stable sort: each file's tests stay together and
    # in their order.
    heavy: dict = {}
    for item in items:
        path = str(getattr(item, "path", ""))
        heavy[path] = heavy.get(path, 0) + any(item.get_closest_marker(m) for m in ("slow", "flower"))

    def key(item):
        path = str(getattr(item, "path", ""))
        return (not path.endswith(".ipynb"), -heavy[path])

    items.sort(key=key)


def pytest_configure(config):
    directory = config.getoption("--keep-executed", default=None)
    if directory and config.pluginmanager.hasplugin("nbval"):
        _install_capture(Path(directory).resolve())


class _Shadow:
    """The executed notebook of one nbval file, built cell by cell from the kernel's iopub messages."""

    def __init__(self, nb):
        from nbclient import NotebookClient

        self.nb = copy.deepcopy(nb)
        self.code_cells = [i for i, c in enumerate(self.nb.cells) if c.cell_type == "code"]
        for i in self.code_cells:
            self.nb.cells[i].outputs = []
            self.nb.cells[i].execution_count = None
        # a client that never starts a kernel: only its message handling is used
        self.client = NotebookClient(self.nb, record_timing=False)
        self.ran: set[int] = set()
        self.ok = True
        self.current: int | None = None     # index in nb.cells of the cell being run
        self.msg_id: str | None = None

    def feed(self, msg) -> None:
        from nbclient.exceptions import CellExecutionComplete

        if self.current is None or msg.get("parent_header", {}).get("msg_id") != self.msg_id:
            return
        try:
            self.client.process_message(msg, self.nb.cells[self.current], self.current)
        except CellExecutionComplete:
            pass

    def finished(self) -> bool:
        return self.ok and self.ran == set(range(len(self.code_cells)))


def _install_capture(directory: Path) -> None:
    import sys

    from nbval.plugin import IPyNbCell, IPyNbFile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from scripts import executed_store

    if getattr(IPyNbFile, "_fedlab_capture", False):
        return
    IPyNbFile._fedlab_capture = True
    orig_setup, orig_teardown = IPyNbFile.setup, IPyNbFile.teardown
    orig_get, orig_runtest = IPyNbFile.get_kernel_message, IPyNbCell.runtest

    def setup(self):
        orig_setup(self)
        self._fedlab_shadow = _Shadow(self.nb)
        self._fedlab_fingerprint = executed_store.fingerprint(Path(str(self.fspath)))
        kernel, shadow = self.kernel, self._fedlab_shadow
        # nbclient's Output-widget mimic syncs its state back to the kernel, as a front end does
        shadow.client.kc = kernel.kc

        def execute_cell_input(cell_input, allow_stdin=None):
            # as nbclient (the book) executes a cell: with history, so that IPython's trailing-semicolon rule
            # (which reads the history) hides a cell's value as it does in the book; nbval's own call passes
            # store_history=False, and `widgets.interact(...);` would then show a stray execute_result
            shadow.msg_id = kernel.kc.execute(cell_input, store_history=True, allow_stdin=False)
            return shadow.msg_id

        kernel.execute_cell_input = execute_cell_input

    def get_kernel_message(self, timeout=None, stream="iopub"):
        msg = orig_get(self, timeout=timeout, stream=stream)
        shadow = getattr(self, "_fedlab_shadow", None)
        if shadow is not None and stream == "iopub":
            shadow.feed(msg)
        return msg

    def runtest(self):
        shadow = getattr(self.parent, "_fedlab_shadow", None)
        if shadow is None:
            return orig_runtest(self)
        shadow.current, shadow.msg_id = shadow.code_cells[self.cell_num], None
        shadow.nb.cells[shadow.current].outputs = []
        shadow.client.clear_before_next_output = False     # as nbclient does before each cell
        try:
            orig_runtest(self)
        except BaseException:
            shadow.ok = False
            raise
        finally:
            shadow.current = None
        shadow.ran.add(self.cell_num)
        shadow.nb.cells[shadow.code_cells[self.cell_num]].execution_count = len(shadow.ran)

    def teardown(self):
        shadow = getattr(self, "_fedlab_shadow", None)
        try:
            if shadow is not None and shadow.finished():
                from ipykernel.ipkernel import IPythonKernel

                shadow.client.set_widgets_metadata()
                shadow.nb.metadata["language_info"] = dict(IPythonKernel.language_info)
                executed_store.store(Path(str(self.fspath)), shadow.nb, self._fedlab_fingerprint, directory)
        finally:
            orig_teardown(self)

    IPyNbFile.setup, IPyNbFile.teardown = setup, teardown
    IPyNbFile.get_kernel_message, IPyNbCell.runtest = get_kernel_message, runtest
