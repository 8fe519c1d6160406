"""Fixtures for the sampling tests: a minimal ``RowLike`` sequence state."""

from __future__ import annotations

import pytest
import torch
from attrs import define, field

from metrale_core.sampling import SamplingParams


@define
class Row:
    """The smallest object satisfying ``metrale_core.sampling.RowLike``."""

    params: SamplingParams
    prompt_ids: list = field(factory=list)
    output_ids: list = field(factory=list)
    generator: torch.Generator | None = None
    extras: dict = field(factory=dict)


def _make_row(prompt=(), output=(), seed=0, **params) -> Row:
    return Row(
        params=SamplingParams(**params),
        prompt_ids=list(prompt),
        output_ids=list(output),
        generator=torch.Generator().manual_seed(seed),
    )


@pytest.fixture
def make_row():
    """``make_row(prompt=(), output=(), seed=0, **sampling_params) -> Row``."""
    return _make_row
