"""``met serve``'s data-parallel flag checks, before anything loads."""

from __future__ import annotations

import argparse

import pytest

from metrale_core.cli.serve import serving_loader
from metrale_core.errors import ConfigError


@pytest.mark.parametrize(
    ("dp", "tp", "message"),
    [
        (0, 1, "--data-parallel-size must be >= 1"),
        (2, 2, "--data-parallel-size with --tensor-parallel-size > 1 is not supported yet"),
    ],
)
def test_bad_parallel_combinations_are_refused_before_loading(dp, tp, message):
    args = argparse.Namespace(data_parallel_size=dp, tensor_parallel_size=tp)
    with pytest.raises(ConfigError, match=message):
        serving_loader(args, registry=None, model=None)
