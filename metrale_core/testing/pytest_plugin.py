"""Metrale's pytest plugin (entry point ``pytest11: metrale``): fixtures for engine tests.

Fixtures:
- ``fake_clock``: a fresh :class:`~metrale_core.testing.FakeClock`.
- ``recording_model_factory``: ``factory(scripts, **options) -> RecordingModel``.
- ``tiny_engine``: ``factory(model, **engine_config) -> LLMEngine`` over the test's ``fake_clock``
  with small defaults (block_size 4, 64 blocks, 64 prefill tokens, 8 sequences).
- ``golden_dir``: where goldens live (``<rootdir>/tests/golden``); override it in a plugin's
  ``conftest.py`` to keep that plugin's goldens beside its tests.
- marker ``metrale_needs_file(path, hint)`` (see :func:`metrale_core.testing.requires.needs_file`):
  skip where ``path`` is absent, fail under ``CI=true``.
- ``golden``: ``golden(name, text)`` compares with ``<golden_dir>/<name>.trace``; with
  ``--update-goldens`` it writes the file instead.
- The session's GGUF repack cache (``METRALE_REPACK_CACHE``, unless the environment sets it) is a
  temporary directory removed at the end: tests neither fill the user's cache with their fixture
  files nor depend on what an earlier run left there.

Owner: tests of metrale-core and of every plugin (loaded automatically once metrale-core is
installed).  Invariants: importing this module imports no engine code; fixtures import lazily.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from metrale_core.testing.clock import FakeClock
from metrale_core.testing.golden import GoldenStore
from metrale_core.testing.recording_model import RecordingModel

#: ``metrale_core.layers.formats.repack_cache.CACHE_ENV`` (not imported: this module imports no engine code).
REPACK_CACHE_ENV = "METRALE_REPACK_CACHE"
#: The repack cache directory a session made (on its ``Config``: an in-process nested session,
#: ``pytester.runpytest``, finds the variable set and neither makes nor removes one).
_SESSION_CACHE = pytest.StashKey[str]()

#: Engine config the ``tiny_engine`` fixture starts from (keywords override it).
TINY_ENGINE_DEFAULTS = dict(block_size=4, num_kv_blocks=64, max_prefill_tokens=64, max_num_seqs=8)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "metrale_needs_file(path, hint): the test needs this file; skipped "
        "where it is absent, FAILED under CI=true (metrale_core.testing.requires.needs_file)",
    )
    if REPACK_CACHE_ENV not in os.environ:
        config.stash[_SESSION_CACHE] = os.environ[REPACK_CACHE_ENV] = tempfile.mkdtemp(prefix="metrale-repack-")


def pytest_unconfigure(config: pytest.Config) -> None:
    made = config.stash.get(_SESSION_CACHE, None)
    if made is not None:
        os.environ.pop(REPACK_CACHE_ENV, None)
        shutil.rmtree(made, ignore_errors=True)


def pytest_runtest_setup(item: pytest.Item) -> None:
    from metrale_core.testing.requires import require_file

    for mark in item.iter_markers("metrale_needs_file"):
        require_file(*mark.args)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("metrale")
    group.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="write golden traces (tests/golden/*.trace) instead of comparing with them",
    )


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def recording_model_factory():
    def factory(scripts, **options) -> RecordingModel:
        return RecordingModel(scripts, **options)

    return factory


@pytest.fixture
def tiny_engine(fake_clock: FakeClock):
    from metrale_core.engine.config import EngineConfig
    from metrale_core.engine.engine import LLMEngine

    def factory(model, **config):
        settings = {**TINY_ENGINE_DEFAULTS, "clock": fake_clock, **config}
        return LLMEngine(model, EngineConfig(**settings))

    return factory


@pytest.fixture
def golden_dir(request: pytest.FixtureRequest) -> Path:
    return Path(request.config.rootpath) / "tests" / "golden"


@pytest.fixture
def golden(request: pytest.FixtureRequest, golden_dir: Path) -> GoldenStore:
    return GoldenStore(directory=golden_dir, update=bool(request.config.getoption("--update-goldens")))
