"""Config -> what varies per layer (windows, NoPE) and the values of a definition's scalars.

Owner: ``metrale_core.decoder``; ``dims.DecoderDims.from_config`` calls these once per load.

Invariants:
- A :data:`~metrale_core.decoder.spec.Scalar` string is ``"key"`` or ``"key**p"``; a key absent
  from the config or null there is off (None), as transformers treats a null soft-cap.
- Windows (``LayerPattern.sliding_window``): none when the recipe declares none, the config's
  window is null, or the config says ``use_sliding_window: false``; else the config's
  ``layer_types`` name the sliding layers, failing that every layer slides but every k-th
  (1-based; k = the config's ``sliding_window_pattern``, else the recipe's ``global_every``).
  A layer's type (:func:`layer_sliding`) holds even where its window is off: it picks the
  sliding layers' own RoPE base (``LayerPattern.sliding_rope_theta``).
- RoPE per layer (where the recipe declares ``LayerPattern.nope_every``): the config's
  ``no_rope_layers`` (1: RoPE, 0: NoPE) wins, then ``no_rope_layer_interval``, then the recipe's
  ``nope_every``; every k-th layer (1-based) is NoPE, as transformers' SmolLM3 config derives it.
- Anything malformed is a ``ConfigError`` naming the family and the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from metrale_core.decoder.spec import DecoderSpec, Scalar
from metrale_core.errors import ConfigError

__all__ = ["layer_ropes", "layer_sliding", "layer_windows", "scalar"]


def scalar(config: Mapping[str, Any], value: Scalar, family: str) -> float | None:
    """The value of ``value`` (a :data:`Scalar`) under ``config``; None: off."""
    if value is None or isinstance(value, (int, float)):
        return None if value is None else float(value)
    key, _, power = value.partition("**")
    raw = config.get(key)
    if raw is None:
        return None
    try:
        number = float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{family}: config {key!r} = {raw!r} is not a number") from None
    return number ** float(power) if power else number


def layer_sliding(config: Mapping[str, Any], spec: DecoderSpec, num_layers: int) -> tuple[bool, ...]:
    """Whether each layer is a sliding layer by its type (whatever its window): the config's
    ``layer_types``, else every layer but every k-th (``sliding_window_pattern``, else the recipe's
    ``global_every``); none where the recipe declares no window."""
    pattern = spec.layers
    if pattern.sliding_window is None:
        return (False,) * num_layers
    types = config.get("layer_types")
    if types is not None:
        types = tuple(types)
        if len(types) != num_layers or set(types) - {"sliding_attention", "full_attention"}:
            raise ConfigError(
                f"{spec.name}: layer_types must list {num_layers} entries of sliding_attention / "
                f"full_attention, got {list(types)}"
            )
        return tuple(t == "sliding_attention" for t in types)
    every = config.get("sliding_window_pattern") or pattern.global_every
    return tuple(not (every and (i + 1) % int(every) == 0) for i in range(num_layers))


def layer_windows(config: Mapping[str, Any], spec: DecoderSpec, num_layers: int) -> tuple[int | None, ...]:
    """The attention window of every layer (None: the whole context); see the module invariants."""
    pattern = spec.layers
    if pattern.sliding_window is None:
        if config.get("use_sliding_window"):
            raise ConfigError(f"{spec.name}: sliding-window attention is not supported")
        return (None,) * num_layers
    window = config.get(pattern.sliding_window)
    if window is None or config.get("use_sliding_window", True) is False:
        return (None,) * num_layers
    if int(window) < 1:
        raise ConfigError(f"{spec.name}: {pattern.sliding_window} must be >= 1, not {window}")
    return tuple(int(window) if s else None for s in layer_sliding(config, spec, num_layers))


def layer_ropes(config: Mapping[str, Any], spec: DecoderSpec, num_layers: int) -> tuple[bool, ...]:
    """Whether every layer rotates q and k (False: NoPE); see the module invariants."""
    if spec.layers.nope_every is None:
        return (True,) * num_layers
    listed = config.get("no_rope_layers")
    if listed is not None:
        if len(listed) != num_layers:
            raise ConfigError(f"{spec.name}: no_rope_layers lists {len(listed)} layers, not {num_layers}")
        return tuple(bool(x) for x in listed)
    every = config.get("no_rope_layer_interval") or spec.layers.nope_every
    return tuple((i + 1) % int(every) != 0 for i in range(num_layers))
