"""Test support for metrale-b1: rows with a stream parser, logits with a known top-1/top-2 gap,
a scripted model wrapper that puts a runner-up at a fixed gap below every answer, a piece
tokenizer, and a loguru capture of the observer's lines."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import attrs
import torch
from attrs import define, field
from loguru import logger

from metrale_core.plugin.registry import Registry as _CoreRegistry
from metrale_core.sampling import SamplingParams

OBSERVER_LOGGER = "metrale_b1.b1_margin"


@define
class Row:
    """A ``RowLike`` with a stream parser in its extras."""

    parser: object = None
    params: SamplingParams = field(factory=lambda: SamplingParams(temperature=0.0, max_tokens=8))
    prompt_ids: tuple = (5,)
    output_ids: list = field(factory=list)
    generator: object = None
    extras: dict = field(factory=dict)

    def __attrs_post_init__(self) -> None:
        if self.parser is not None:
            self.extras["stream_parser"] = self.parser


def gap_logits(
    num_rows: int, vocab: int = 32, *, gap: float = 1.0, top1: int = 5, top2: int = 9, seed: int = 0
) -> torch.Tensor:
    """Random logits in [-3, 3) with ``top1`` at 10 and ``top2`` at ``10 - gap`` in every row."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.rand(num_rows, vocab, generator=g) * 6.0 - 3.0
    logits[:, top1] = 10.0
    logits[:, top2] = 10.0 - gap
    return logits


def observer_spec(stats):
    """The registered ``b1-margin`` spec, its factory bound to an observer counting into ``stats``."""
    from metrale_b1.b1_margin import B1MarginObserver
    from metrale_core.plugin.discovery import load_registry

    spec = load_registry().logit_processors["b1-margin"]
    return attrs.evolve(spec, factory=lambda config: B1MarginObserver(stats))


class SpecRegistry(_CoreRegistry):
    """Just enough registry for ``LLMEngine``: the default sampler, FCFS, and given processors."""

    def __init__(self, *specs) -> None:
        super().__init__()  # a real (typed) Registry with an empty plugin manager
        from metrale_core.engine import FcfsPolicy
        from metrale_core.plugin.components import SamplerSpec, SchedulerSpec
        from metrale_core.sampling import DefaultSampler

        self.samplers = {"default": SamplerSpec("default", DefaultSampler)}
        self.schedulers = {"fcfs": SchedulerSpec("fcfs", FcfsPolicy)}
        self.logit_processors = {s.name: s for s in specs}


class GapModel:
    """Wraps a scripted ``CausalLM`` whose rows are one-hot at ``high``: token ``runner_up`` gets
    ``row max - gap`` in every row, so each position's top-1/top-2 gap is exactly ``gap``."""

    def __init__(self, inner, *, gap: float, runner_up: int) -> None:
        self.inner = inner
        self.info = inner.info
        self.gap = gap
        self.runner_up = runner_up

    def make_state_pool(self, num_slots: int):
        return self.inner.make_state_pool(num_slots)

    def forward(self, batch, kv, state=None) -> torch.Tensor:
        logits = self.inner.forward(batch, kv, state).clone()
        if logits.shape[0]:
            logits[:, self.runner_up] = logits.max(dim=-1).values - self.gap
        return logits


class PieceTokenizer:
    """Token ``i`` decodes to ``pieces[i]`` (ids past the list decode to nothing)."""

    def __init__(self, pieces: list[str], eos: int) -> None:
        self.pieces = pieces
        self.eos_token_ids = (eos,)

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.pieces[i] if i < len(self.pieces) else "" for i in ids)


@contextmanager
def captured_lines() -> Iterator[list[tuple[str, str, str]]]:
    """``(level, logger name, message)`` of every loguru line the observer module writes."""
    lines: list[tuple[str, str, str]] = []

    def sink(message) -> None:
        record = message.record
        lines.append((record["level"].name, record["name"], record["message"]))

    sink_id = logger.add(sink, level="TRACE", filter=lambda r: r["name"] == OBSERVER_LOGGER)
    try:
        yield lines
    finally:
        logger.remove(sink_id)
