"""TP=2 against TP=1 through the real engine path, checked the one way every model plugin checks it.

Owner: the model plugins' tensor-parallel tests (qwen3 / llama, the MoE families, Gemma 3); they
keep their checkpoints and configs, this module runs and compares.

Invariants:
- :func:`run_engine` drives :func:`metrale_core.testing.tensor_parallel.run_recording` with one
  engine shape (blocks of 4 tokens, prefill chunks of 8, at most 4 sequences) and greedy
  sampling that ignores EOS, so a split and an unsplit run see the same schedule.
- :func:`assert_tp2_matches_tp1` loads the same path once on one rank and once over two (a worker
  process, gloo on loopback), closes the split model whatever happens, and asserts the schedule
  exercised preemption, batched decode and chunked prefill, the same greedy tokens, and every
  step's logits of the same shape and within ``atol`` (``rtol`` 0).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from metrale_core.testing.tensor_parallel import EngineRun, run_recording

__all__ = ["assert_tp2_matches_tp1", "run_engine", "write_word_tokenizer"]


def write_word_tokenizer(directory: Path, vocab_size: int) -> None:
    """A word-level ``tokenizer.json`` (tokens ``t0``.. ``t{vocab_size - 1}``) in ``directory``:
    ``load_model`` wants a tokenizer beside the weights."""
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(vocab_size)}
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(Path(directory) / "tokenizer.json"))


def run_engine(model: Any, prompts: Sequence[Sequence[int]], *, num_kv_blocks: int, max_tokens: int) -> EngineRun:
    """``prompts`` through an engine on ``model`` (``num_kv_blocks`` blocks of 4 tokens, prefill
    chunks of 8, 4 sequences at most), greedy, ``max_tokens`` each, recorded step by step."""
    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.sampling import SamplingParams

    config = EngineConfig(block_size=4, num_kv_blocks=num_kv_blocks, max_prefill_tokens=8, max_num_seqs=4)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return run_recording(LLMEngine(model, config), prompts, params)


def assert_tp2_matches_tp1(
    path: Path,
    options: Any,
    run: Callable[[Any], EngineRun],
    *,
    atol: float,
    check_split: Callable[[Any], None] | None = None,
) -> None:
    """``run`` (a model -> its :class:`EngineRun`) on ``path`` loaded with ``options`` on one rank
    and over two; ``check_split`` sees the split model before it runs."""
    import torch

    from metrale_core.loading.load import load_model
    from metrale_core.parallel.launch import load_parallel

    single = run(load_model(path, options, progress=False).model)
    loaded = load_parallel(path, options, size=2, backend="mp", threads=1, progress=False)
    try:
        if check_split is not None:
            check_split(loaded.model)
        split = run(loaded.model)
    finally:
        loaded.model.close()
    assert split.preemptions > 0 and split.batched_decode_steps > 0 and split.partial_prefill_steps > 0
    assert split.tokens == single.tokens, (split.tokens, single.tokens)
    assert len(split.logits) == len(single.logits)
    for a, b in zip(split.logits, single.logits, strict=True):
        assert a.shape == b.shape
        assert torch.allclose(a, b, atol=atol, rtol=0), (a - b).abs().max().item()
