"""Random transformers models for parity tests: eager attention, and every parameter noisy.

Owner: the model plugins' test harnesses (qwen3, gemma3, lora, speculative), which build small
random HF models as the oracle of their definitions; each keeps its configs and its noise scales.

Invariants:
- :func:`eager_model` seeds torch with ``seed`` right before the config and the model are built,
  so the same arguments give the same initial weights; the model is in eval mode with eager
  attention (the reference path every parity test compares with).
- :func:`randomize_` draws one normal sample per parameter, in ``named_parameters`` order, from a
  generator seeded with ``seed``: a norm's weight (a name containing ``norm``) becomes
  ``center + scale * noise`` (``norms``), a bias ``biases * noise`` when ``biases`` is given, any
  other parameter ``weights * noise``.  It returns the generator, so a caller may draw on.
"""

from __future__ import annotations

from typing import Any

__all__ = ["eager_model", "randomize_"]


def eager_model(config_cls: Any, model_cls: Any, seed: int, **config: Any) -> Any:
    """``model_cls(config_cls(**config))`` built after ``torch.manual_seed(seed)``, eager, eval."""
    import torch

    torch.manual_seed(seed)
    cfg = config_cls(**config)
    cfg._attn_implementation = "eager"
    return model_cls(cfg).eval()


def randomize_(
    model: Any,
    seed: int,
    *,
    weights: float = 0.08,
    norms: tuple[float, float] = (1.0, 0.2),
    biases: float | None = None,
) -> Any:
    """Give every parameter of ``model`` random values (in place) so that norms, biases and heads
    all matter; returns the generator the noise came from."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    center, scale = norms
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name:
                p.copy_(center + scale * noise)
            elif biases is not None and name.endswith("bias"):
                p.copy_(biases * noise)
            else:
                p.copy_(weights * noise)
    return gen
