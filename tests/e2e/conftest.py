"""End-to-end tests need the Qwen3 plugin and transformers (the oracle)."""

import pytest

pytest.importorskip("metrale_qwen3")
pytest.importorskip("transformers")
