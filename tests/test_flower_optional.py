"""The `flower` extra is optional: without flwr, `import fedlab` and stored transcripts still work, and
the Flower apps fail with an ImportError that names the extra (runs with or without flwr installed)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CODE = """
import sys
sys.modules["flwr"] = None          # as if Flower were not installed
import fedlab
assert "fedlab.flower" not in sys.modules, "import fedlab must not import fedlab.flower"
import fedlab.flower
from fedlab.flower import load_transcript, TranscriptWriter
assert not any(m == "flwr" or m.startswith("flwr.") for m in sys.modules if sys.modules[m] is not None)
try:
    fedlab.flower.run
except ImportError as err:
    assert ".[flower]" in str(err), err
    print("ok")
else:
    raise AssertionError("fedlab.flower.run imported without flwr")
"""


@pytest.mark.slow
def test_fedlab_imports_without_flower():
    res = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stdout + res.stderr
