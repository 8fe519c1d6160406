"""Engine-vs-transformers parity runs: random prompts, a spied engine joining them mid-prefill, and
the worst logits row against transformers on the exact history each row attended to.

Owner: the parity tests of core (``tests/e2e/test_engine_hf_parity.py``) and of the model plugins
(gemma3's and glm-kda's ``test_*_parity.py``), which give a *harness* module with ``VOCAB``,
``save_checkpoint(name, path, seed)``, ``hf_logits(model, ids)`` and ``hf_greedy(model, prompt, n)``.

Invariants:
- Deterministic: a case's weights and prompts are seeded by its name's length.
- Every row a :class:`~metrale_core.testing.forward_spy.ForwardSpy` recorded must have attended to
  a prefix of some request's prompt + output (else ``AssertionError``), and is compared with the
  reference logits of the first such request at that history's last position.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["PROMPT_LENGTHS", "parity_case", "random_prompts", "run_staggered", "worst_row_diff"]

#: The first prompt is longer than a 20-token prefill chunk, so it is mid-prefill when the others join.
PROMPT_LENGTHS = (30, 9, 70, 21)


def random_prompts(seed: int, vocab: int, lengths: Sequence[int] = PROMPT_LENGTHS) -> list[list[int]]:
    """One prompt of token ids in ``[3, vocab)`` per length, from ``seed``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def parity_case(harness: Any, name: str, path: Path, new_tokens: int) -> tuple[str, Path, Any, list, list]:
    """``(name, path, hf, prompts, greedy)``: ``harness``'s model ``name`` saved into ``path``, its
    prompts, and transformers' ``new_tokens`` greedy tokens after each."""
    hf = harness.save_checkpoint(name, path, seed=len(name))
    prompts = random_prompts(len(name), harness.VOCAB)
    return name, path, hf, prompts, [harness.hf_greedy(hf, p, new_tokens) for p in prompts]


def run_staggered(spy: Any, registry: Any, num_kv_blocks: int, prompts: Sequence[Sequence[int]], new_tokens: int):
    """An engine over ``spy`` (block size 4, prefill chunks of 20 tokens, four sequences at most)
    running ``prompts`` greedily (``ignore_eos``), the first one mid-prefill when the others join;
    returns the engine and each request's new tokens."""
    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.sampling.params import SamplingParams
    from metrale_core.testing.staggered import run_joining_mid_prefill

    config = EngineConfig(block_size=4, num_kv_blocks=num_kv_blocks, max_prefill_tokens=20, max_num_seqs=4)
    engine = LLMEngine(spy, config, registry=registry)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    return engine, run_joining_mid_prefill(engine, prompts, params)


def worst_row_diff(
    rows: Sequence[tuple[tuple[int | None, ...], Any]],
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    logits_of: Callable[[list[int]], Any],
) -> float:
    """The largest ``|row - reference|`` over a spy's ``rows``; ``logits_of(ids)`` is the reference's
    ``[len(ids), vocab]`` logits of one sequence."""
    full = [list(p) + list(o) for p, o in zip(prompts, outputs, strict=True)]
    ref = [logits_of(seq[:-1]) for seq in full]
    worst = 0.0
    for history, row in rows:
        owners = [i for i, seq in enumerate(full) if tuple(seq[: len(history)]) == history]
        assert owners, f"the model attended to a history that is no request's prefix: {history}"
        worst = max(worst, (row - ref[owners[0]][len(history) - 1]).abs().max().item())
    return worst
