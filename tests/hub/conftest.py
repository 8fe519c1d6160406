"""Fixtures for the hub tests: a loopback fake hub and a temporary HF_HOME pointed at it."""

from __future__ import annotations

import pytest

from tests.hub.fake_hub import FakeHub


@pytest.fixture
def hub(tmp_path, monkeypatch):
    fake = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield fake
    fake.close()
