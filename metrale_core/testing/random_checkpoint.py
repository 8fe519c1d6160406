"""Small random transformers checkpoints on disk (Qwen3 and Llama shapes) for tests that load or serve one.

Owner: the test fixtures that need a real checkpoint directory (the server tests' tiny Qwen3s,
the hub test, :mod:`metrale_core.testing.tiny_llama`, metrale-ray's executor test); each names
only what its model changes from :data:`TINY`.

Invariants:
- Deterministic: ``torch.manual_seed(seed)`` right before the model is built, so the same
  arguments give the same weights.
- The config is ``TINY[arch]`` updated with the caller's keywords, nothing else (transformers'
  defaults for the rest).
- With ``tokenizer=True`` the byte-level tokenizer of :mod:`metrale_core.testing.byte_tokenizer`
  is written beside the weights, and the vocabulary is its size unless ``vocab_size`` is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from metrale_core.testing.byte_tokenizer import write_tokenizer

__all__ = ["TINY", "write_random_checkpoint"]

#: Per transformers architecture prefix, the shapes of its tiny model (tied embeddings).
TINY: dict[str, dict[str, Any]] = {
    # 2 query heads over 1 KV head of 16 dims
    "Qwen3": dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    ),
    # 6 query heads over 3 KV heads of 8 dims: splits over 2 or 3 tensor-parallel ranks
    "Llama": dict(
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=3,
        tie_word_embeddings=True,
    ),
}


def write_random_checkpoint(
    directory: Path, arch: str = "Qwen3", *, tokenizer: bool = True, seed: int = 0, **config: Any
) -> Any:
    """Write ``{arch}ForCausalLM`` of ``TINY[arch]`` updated with ``config``, random weights from
    ``seed``, as safetensors (and the byte tokenizer when ``tokenizer``) into ``directory``;
    return the model (in eval mode)."""
    import torch
    import transformers

    if tokenizer:
        from metrale_core.text.tokenizer import Tokenizer

        write_tokenizer(directory)
        config.setdefault("vocab_size", Tokenizer.from_dir(directory).vocab_size)
    hf_config = getattr(transformers, f"{arch}Config")(**{**TINY[arch], **config})
    torch.manual_seed(seed)
    model = getattr(transformers, f"{arch}ForCausalLM")(hf_config).eval()
    model.save_pretrained(directory, safe_serialization=True)
    return model
