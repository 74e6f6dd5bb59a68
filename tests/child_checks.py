"""Several checks that each need a fresh interpreter (a script run as ``__main__``, a snippet run where the notebook
stack cannot be imported) run in one child process, one after the other: each interpreter start with its torch
import costs about 2.5 s of CPU. Each check runs in a fresh namespace and its own working directory, its
stdout captured; one that raises (or exits non-zero) is recorded as failed and the next still runs, so each test
asserts on its own check and fails alone."""
import json
import os
import subprocess
import sys

_RUNNER = """
import contextlib, io, json, os, runpy, sys, traceback
RESULTS = {}
for c in json.loads(sys.argv[1]):
    for mod in ('IPython', 'myst_nb'):
        if c.get('block_notebook_stack'):
            sys.modules[mod] = None
        elif mod in sys.modules and sys.modules[mod] is None:
            del sys.modules[mod]
    out, ok, error = io.StringIO(), True, None
    try:
        os.chdir(c['cwd'])
        with contextlib.redirect_stdout(out):
            if 'script' in c:
                sys.argv = [c['script'], *c.get('args', [])]
                runpy.run_path(c['script'], run_name='__main__')
            else:
                exec(compile(c['code'], c['name'], 'exec'), {'__name__': '__main__'})
    except SystemExit as e:
        ok = e.code in (None, 0)
        error = None if ok else f'SystemExit({e.code!r})'
    except BaseException:
        ok, error = False, traceback.format_exc()[-2500:]
    RESULTS[c['name']] = {'ok': ok, 'stdout': out.getvalue(), 'error': error}
sys.stdout.write('RESULTS ' + json.dumps(RESULTS) + chr(10))
"""


def run(checks: list[dict], *, cwd, env: dict | None = None, inherit_env: bool = True, timeout: float = 600) -> dict:
    """Run ``checks`` in order in one fresh interpreter started in ``cwd`` with ``env`` added to this process's
    environment (``env`` alone where ``inherit_env`` is false). A check is ``{"name", "cwd", "code"}`` (a snippet) or ``{"name", "cwd", "script", "args"}`` (a
    script run as ``__main__`` with ``sys.argv = [script, *args]``), with ``"block_notebook_stack": True`` to run
    it with IPython and myst_nb unimportable. Returns ``{name: {"ok", "stdout", "error"}}``; raises
    ``AssertionError`` with the child's stderr if the child itself died."""
    res = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(checks)], cwd=cwd, capture_output=True,
                         text=True, timeout=timeout, env={**(os.environ if inherit_env else {}), **(env or {})})
    line = [x for x in res.stdout.splitlines() if x.startswith("RESULTS ")]
    assert res.returncode == 0 and line, f"the child of {[c['name'] for c in checks]} died: {res.stderr[-3000:]}"
    return json.loads(line[-1][len("RESULTS "):])


def selected(request, *test_names: str) -> bool:
    """Whether any of the tests ``test_names`` (function names) of this module is among the session's items, so a
    shared fixture runs only the checks of the tests that will run (``-m``, ``-k``)."""
    mod = request.module.__name__
    return any(item.module.__name__ == mod and getattr(item, "originalname", item.name) in test_names
               for item in request.session.items if getattr(item, "module", None) is not None)
