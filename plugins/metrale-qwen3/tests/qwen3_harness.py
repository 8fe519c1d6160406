"""Test harness for the qwen3 plugin: HF reference models, weight stores and a tiny paged runner.

Owner: ``plugins/metrale-qwen3/tests``.  It plays the engine's role by hand: it allocates KV blocks
on demand from a shuffled free list (so block tables are not the identity), builds
``ForwardBatch`` records exactly as ``metrale_core.model_api`` documents them and records the
logits of every row, keyed by (sequence, position), for comparison with HF transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from metrale_core.errors import ShapeMismatch, WeightsError
from metrale_core.model_api import ForwardBatch, PagedKVCache
from metrale_core.plugin.components import LoadOptions
from metrale_core.testing.hf_random import eager_model, randomize_
from metrale_core.testing.requires import needs_file
from metrale_core.weights import open_weights


class FakeStore:
    """The WeightStore surface the loader uses, over a saved checkpoint's state dict."""

    def __init__(self, tensors: dict[str, torch.Tensor], config: dict) -> None:
        self.config = config
        self._tensors = tensors

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def names(self) -> list[str]:
        return sorted(self._tensors)

    def get(self, name: str, *, dtype: torch.dtype = torch.float32, shape=None) -> torch.Tensor:
        if name not in self._tensors:
            raise WeightsError(f"tensor {name!r} is not in the checkpoint")
        t = self._tensors[name]
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise ShapeMismatch(f"tensor {name!r} has shape {list(t.shape)}, expected {list(shape)}")
        return t.to(dtype).clone()


def build_hf(config_cls, model_cls, seed: int, **config_kwargs):
    """A random HF model (eager attention, fp32, eval mode)."""
    model = eager_model(config_cls, model_cls, seed, **config_kwargs)
    randomize_(model, seed, biases=0.1)
    if model.config.tie_word_embeddings:
        model.tie_weights()
    return model


def save_checkpoint(model, directory: Path) -> Path:
    model.save_pretrained(directory)
    return directory


def open_store(directory: Path, *, use_real: bool | None = None) -> Any:
    """The real ``open_weights`` store (default), or a FakeStore with ``use_real=False``."""
    if use_real is None or use_real:
        return open_weights(directory)
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(f))
    return FakeStore(tensors, json.loads((directory / "config.json").read_text()))


def load(spec_name: str, store: Any, dtype: str = "float32", device: str = "cpu", weight_format: str | None = "exact"):
    """Build a model through the registered loader factory (as the engine does); in the ``exact``
    weight format unless told otherwise (None: the environment's, else the default ``auto``)."""
    from metrale_qwen3 import metrale_model_loaders

    specs = {}
    metrale_model_loaders(lambda spec: specs.__setitem__(spec.name, spec))
    return specs[spec_name].factory(store, LoadOptions(dtype=dtype, device=device, weight_format=weight_format))


class PagedRunner:
    """Plays the engine: owns a paged cache, allocates blocks on demand, runs mixed batches."""

    def __init__(self, model, *, num_blocks: int = 96, block_size: int = 4, seed: int = 0, device: str = "cpu") -> None:
        self.model = model
        self.block_size = block_size
        self.device = torch.device(device)
        self.kv = PagedKVCache.allocate(model.info.kv, num_blocks, block_size, device=device)
        gen = torch.Generator().manual_seed(seed)
        self.free = torch.randperm(num_blocks, generator=gen).tolist()
        self.tables: dict[int, list[int]] = {}
        self.tokens: dict[int, list[int]] = {}
        #: (seq, position) -> float32 logits row.
        self.logits: dict[tuple[int, int], torch.Tensor] = {}

    def _slots(self, seq: int, start: int, n: int) -> list[int]:
        table = self.tables.setdefault(seq, [])
        while len(table) * self.block_size < start + n:
            table.append(self.free.pop())
        return [table[p // self.block_size] * self.block_size + p % self.block_size for p in range(start, start + n)]

    def step(self, work: list[tuple[int, list[int]]]) -> dict[int, torch.Tensor]:
        """Feed ``tokens`` to each ``seq``; return the logits of each sequence's last row."""
        ids, positions, slots, qlens, clens, fresh = [], [], [], [], [], []
        for seq, toks in work:
            start = len(self.tokens.get(seq, []))
            ids += toks
            positions += range(start, start + len(toks))
            slots += self._slots(seq, start, len(toks))
            qlens.append(len(toks))
            clens.append(start + len(toks))
            fresh.append(start == 0)
        width = max(len(self.tables[seq]) for seq, _ in work)
        tables = [self.tables[seq] + [0] * (width - len(self.tables[seq])) for seq, _ in work]
        t = lambda xs: torch.tensor(xs, dtype=torch.int64, device=self.device)
        batch = ForwardBatch(
            input_ids=t(ids),
            positions=t(positions),
            query_start=t([0] + torch.tensor(qlens).cumsum(0).tolist()),
            context_lens=t(clens),
            block_tables=t(tables),
            slot_mapping=t(slots),
            logits_rows=t(list(range(len(ids)))),
            state_slots=t([-1] * len(work)),
            state_fresh=torch.tensor(fresh, device=self.device),
            query_lens_host=tuple(qlens),
            context_lens_host=tuple(clens),
            block_size=self.block_size,
        )
        out = self.model.forward(batch, self.kv).cpu()
        assert out.dtype == torch.float32 and out.shape == (len(ids), self.model.info.vocab_size)
        last: dict[int, torch.Tensor] = {}
        row = 0
        for seq, toks in work:
            start = len(self.tokens.get(seq, []))
            for j in range(len(toks)):
                self.logits[(seq, start + j)] = out[row + j]
            self.tokens.setdefault(seq, []).extend(toks)
            row += len(toks)
            last[seq] = out[row - 1]
        return last


def run_mixed_schedule(
    model, prompts: list[list[int]], *, decode_steps: int = 8, block_size: int = 4, device: str = "cpu"
) -> PagedRunner:
    """Chunked prefill of every prompt in 2 chunks, interleaved with greedy decode rows of the
    sequences already prefilled, then ``decode_steps`` pure-decode steps of all sequences."""
    runner = PagedRunner(model, block_size=block_size, device=device)
    next_token: dict[int, int] = {}
    pending = {i: [p[: len(p) // 2], p[len(p) // 2 :]] for i, p in enumerate(prompts)}
    active: list[int] = []
    order = list(range(len(prompts)))
    while any(pending.values()):
        work = [(s, [next_token[s]]) for s in active]  # decode rows first
        for s in order[:2]:  # two sequences prefill a chunk each step
            work.append((s, pending[s].pop(0)))
        for s in [s for s in order[:2] if not pending[s]]:
            order.remove(s)
            active.append(s)
        last = runner.step(work)
        next_token.update({s: int(v.argmax()) for s, v in last.items()})
    for _ in range(decode_steps):
        last = runner.step([(s, [next_token[s]]) for s in sorted(active)])
        next_token.update({s: int(v.argmax()) for s, v in last.items()})
    return runner


@torch.no_grad()
def max_logit_diff(hf_model, runner: PagedRunner) -> float:
    """Largest |ours - HF| over every (sequence, position) the runner produced logits for."""
    worst = 0.0
    for seq, toks in runner.tokens.items():
        ref = hf_model(torch.tensor([toks])).logits[0].float()
        ours = torch.stack([runner.logits[(seq, p)] for p in range(len(toks))])
        worst = max(worst, float((ours - ref).abs().max()))
    return worst


#: The real SmolLM2-135M-Instruct Q4_1 (``met generate`` or ``scripts/fetch-test-data.sh`` fetches it).
SMOL_GGUF = Path.home() / ".cache" / "metrale" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Mark for tests of the real model: skipped where it is absent, failed under CI=true.
needs_smol = needs_file(SMOL_GGUF, "bash scripts/fetch-test-data.sh fetches it")
