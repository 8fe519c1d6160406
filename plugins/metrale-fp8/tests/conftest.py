"""Fixtures of the metrale-fp8 tests (helpers live in ``fp8_testutil``).

Owner: ``plugins/metrale-fp8/tests``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from loguru import logger

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture
def log_lines():
    """Every loguru record at INFO and above, as ``(level, message)``."""
    records: list[tuple[str, str]] = []
    handle = logger.add(lambda m: records.append((m.record["level"].name, m.record["message"])), level="INFO")
    yield records
    logger.remove(handle)


@pytest.fixture(autouse=True)
def _two_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(min(previous, 2))
    yield
    torch.set_num_threads(previous)
