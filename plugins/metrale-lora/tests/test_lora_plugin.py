"""The plugin as installed: its registration, its flags, and what an engine gets from them."""

from __future__ import annotations

import argparse

import pytest

import metrale_lora
from metrale_core.api import ConfigError
from metrale_core.plugin.discovery import load_registry


@pytest.fixture(scope="module")
def registry():
    return load_registry()


def test_installed_and_registered(registry):
    info = next(p for p in registry.plugins if p.name == "lora")
    assert info.error is None and info.distribution == "metrale-lora"


def test_flags_reach_plugin_options(registry):
    parser = argparse.ArgumentParser()
    registry.add_engine_flags(parser)
    args = parser.parse_args(
        ["--lora", "a=/x/a", "--lora", "b=/x/b", "--max-loras", "2", "--max-lora-rank", "16", "--allow-runtime-lora"]
    )
    assert args.lora == ["a=/x/a", "b=/x/b"] and args.max_loras == 2 and args.max_lora_rank == 16
    assert args.allow_runtime_lora is True
    defaults = parser.parse_args([])
    assert defaults.lora is None and defaults.allow_runtime_lora is False
    assert defaults.max_loras == metrale_lora.DEFAULT_MAX_LORAS


@pytest.mark.parametrize("value", ["noequals", "=path", "name=", " = "])
def test_bad_lora_flag_is_a_clear_error(value):
    with pytest.raises(ConfigError, match="NAME=PATH"):
        metrale_lora.parse_lora_flag(value)
    assert metrale_lora.parse_lora_flag("sql = /a/b=c") == ("sql", "/a/b=c")
