from pathlib import Path

import pytest


@pytest.fixture
def golden_dir() -> Path:
    """metrale-slai keeps its golden traces beside its tests."""
    return Path(__file__).parent / "golden"
