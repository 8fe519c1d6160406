"""A tiny random Llama checkpoint on disk, and its greedy text from one in-process engine.

Owner: the multi-process and multi-host tests (``tests/parallel/test_two_hosts.py``,
``tests/server/test_serve_tensor_parallel.py`` and the metrale-ray plugin's), which serve it over
several ranks, replicas or hosts and compare with :func:`greedy_text` (the single-process oracle).

Invariants:
- Deterministic: the same weights (``torch.manual_seed(0)``) and the byte-level tokenizer of
  :mod:`metrale_core.testing.byte_tokenizer` (one token per byte, EOS ``<|im_end|>``), so a
  prompt's text round-trips and the served text of greedy decoding equals :func:`greedy_text`'s.
- Its shapes split over 2 or 3 tensor-parallel ranks (6 heads, 3 KV heads).
"""

from __future__ import annotations

from pathlib import Path

from metrale_core.testing.random_checkpoint import write_random_checkpoint

__all__ = ["greedy_text", "write_tiny_llama"]


def write_tiny_llama(directory: Path) -> Path:
    """Write the checkpoint (``config.json``, safetensors, the tokenizer files) into ``directory``."""
    write_random_checkpoint(directory, "Llama", max_position_embeddings=4096)
    return directory


def greedy_text(directory: Path, prompt: str, max_tokens: int) -> str:
    """The text one in-process engine generates greedily for ``prompt`` (EOS ignored)."""
    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.loading.load import load_model
    from metrale_core.plugin.components import LoadOptions
    from metrale_core.sampling import SamplingParams

    loaded = load_model(directory, LoadOptions(weight_format="exact"), progress=False)
    engine = LLMEngine(loaded.model, EngineConfig(), tokenizer=loaded.tokenizer)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    engine.add_request("r", loaded.tokenizer.encode(prompt), params)
    ids: list[int] = []
    while engine.has_unfinished():
        for out in engine.step():
            ids += out.new_token_ids
    return str(loaded.tokenizer.decode(ids))
