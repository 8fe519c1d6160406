"""Keep this plugin's golden traces beside its tests; make ``spec_harness`` importable."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))


@pytest.fixture
def golden_dir() -> Path:
    return _HERE / "golden"
