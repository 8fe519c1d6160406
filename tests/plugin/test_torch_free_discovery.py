"""Plugin discovery imports no torch: ``met --help``, ``met plugins`` and ``load_registry()``.

Each runs in a fresh interpreter (the installed plugins included), which then reports whether
``torch`` is in ``sys.modules``.  Importing torch takes seconds; the CLI's help and the plugin
list must not pay for it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

_CLI = """
import sys
sys.argv = ["met", *{argv!r}]
from metrale_core.cli.main import main
try:
    main()
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
print("TORCH-LOADED" if "torch" in sys.modules else "TORCH-FREE")
"""

_REGISTRY = """
import sys
from metrale_core.plugin.discovery import load_registry
registry = load_registry()
assert registry.model_loaders and registry.samplers, registry
print("TORCH-LOADED" if "torch" in sys.modules else "TORCH-FREE")
"""


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("argv", [["--help"], ["plugins"]], ids=["help", "plugins"])
def test_the_cli_lists_without_torch(argv):
    assert _run(_CLI.format(argv=argv)) == "TORCH-FREE"


def test_load_registry_imports_no_torch():
    assert _run(_REGISTRY) == "TORCH-FREE"


def test_the_check_can_fail():
    """The probe itself notices torch (so the tests above can fail)."""
    assert (
        _run("import sys, torch\nprint('TORCH-LOADED' if 'torch' in sys.modules else 'TORCH-FREE')") == "TORCH-LOADED"
    )
