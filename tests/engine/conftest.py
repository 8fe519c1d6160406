"""Fixtures for the engine tests: a tiny deterministic model that reads its context BACK FROM
THE PAGED KV CACHE, so a wrong block table, slot mapping or position changes its output.

The model writes an exact-integer embedding of (token, position) into K (and 2*K into V), then for
each logits row sums the cached K of positions ``0..pos`` of its own sequence (read through the
block table) and turns that sum into logits with a generator seeded from it.  All sums are exact
in float32, so results do not depend on batch composition or chunking.  With ``recurrent=True``
it also keeps per-slot recurrent state that must be consumed in order (seed 004): a forward that
does not start where the state expects (and is not ``state_fresh``) raises.
"""

from __future__ import annotations

import pytest
import torch

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.model_api import ForwardBatch, KVLayout, ModelInfo, PagedKVCache, RecurrentLayout
from metrale_core.testing.staggered import run_all

VOCAB = 50
DIM = 5


class StateCorrupted(AssertionError):
    pass


class ToyLM:
    """A ``CausalLM`` whose logits are a function of the (token, position) pairs in its cache."""

    def __init__(self, recurrent: bool = False, eos: tuple[int, ...] = (), max_position: int = 512):
        self.info = ModelInfo(
            architecture="toy",
            vocab_size=VOCAB,
            max_position=max_position,
            kv=KVLayout(num_layers=1, num_kv_heads=1, head_dim=DIM),
            recurrent=RecurrentLayout(num_layers=1, bytes_per_sequence=16) if recurrent else None,
            eos_token_ids=eos,
        )
        self.calls: list[ForwardBatch] = []

    def make_state_pool(self, num_slots: int):
        return {"next": [0] * num_slots, "acc": [0] * num_slots}

    @staticmethod
    def embed(token: int, pos: int) -> list[float]:
        return [float(token), float(pos), float(token * (pos + 1) % 101), float(token * token), 1.0]

    def forward(self, batch: ForwardBatch, kv: PagedKVCache, state=None) -> torch.Tensor:
        self.calls.append(batch)
        qs = batch.query_start.tolist()
        ids, pos = batch.input_ids.tolist(), batch.positions.tolist()
        for r, slot in enumerate(batch.slot_mapping.tolist()):
            e = torch.tensor(self.embed(ids[r], pos[r]))
            kv.k[0][slot // kv.block_size, slot % kv.block_size, 0] = e
            kv.v[0][slot // kv.block_size, slot % kv.block_size, 0] = 2 * e
        accs = {}
        for i in range(batch.num_seqs):
            start = batch.context_lens_host[i] - batch.query_lens_host[i]
            assert pos[qs[i] : qs[i + 1]] == list(range(start, batch.context_lens_host[i]))
            if state is not None:
                slot = int(batch.state_slots[i])
                assert slot >= 0
                if bool(batch.state_fresh[i]):
                    state["next"][slot], state["acc"][slot] = 0, 0
                if state["next"][slot] != start:
                    raise StateCorrupted(f"state of slot {slot} expects {state['next'][slot]}, fed from {start}")
                for r in range(qs[i], qs[i + 1]):
                    state["acc"][slot] = (state["acc"][slot] * 31 + ids[r] * 7 + pos[r]) % 1000003
                state["next"][slot] = batch.context_lens_host[i]
                accs[i] = state["acc"][slot]
        rows = []
        seq_of_row = [i for i in range(batch.num_seqs) for _ in range(qs[i], qs[i + 1])]
        for r in batch.logits_rows.tolist():
            i = seq_of_row[r]
            total = torch.zeros(DIM)
            for p in range(pos[r] + 1):
                block = int(batch.block_tables[i, p // batch.block_size])
                total += kv.k[0][block, p % batch.block_size, 0]
                assert torch.equal(kv.v[0][block, p % batch.block_size, 0], 2 * kv.k[0][block, p % batch.block_size, 0])
            key = hash((tuple(int(x) for x in total.tolist()), accs.get(i, 0))) & 0x7FFFFFFF
            g = torch.Generator().manual_seed(key)
            rows.append(torch.randn(VOCAB, generator=g) * 3.0)
        return torch.stack(rows) if rows else torch.zeros(0, VOCAB)


@pytest.fixture
def toy_model():
    """``toy_model(recurrent=False, eos=()) -> ToyLM``."""
    return ToyLM


@pytest.fixture
def make_engine():
    """``make_engine(model=None, **config) -> LLMEngine`` with small defaults."""

    def make(model=None, tokenizer=None, **config):
        defaults = dict(block_size=4, num_kv_blocks=64, max_prefill_tokens=64, max_num_seqs=16)
        defaults.update(config)
        return LLMEngine(model or ToyLM(), EngineConfig(**defaults), tokenizer=tokenizer)

    return make


@pytest.fixture
def run():
    return run_all


def tokens_of(deltas) -> list[int]:
    return [t for d in deltas for t in d.new_token_ids]


@pytest.fixture
def tokens():
    return tokens_of
