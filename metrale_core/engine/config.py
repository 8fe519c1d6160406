"""``EngineConfig``: the knobs of one engine, validated once at construction.

Owner: the engine (``LLMEngine``) reads it when it is built; the CLI maps its flags onto it
(``metrale_core.cli.flags``).

Invariants:
- Every field is checked at construction; a bad value raises ``ConfigError`` naming the field.
- ``num_kv_blocks`` (when given) overrides the ``kv_cache_memory`` byte budget; otherwise the pool
  holds ``kv_cache_memory // (block_size * layout.bytes_per_page_token())`` blocks (pages of
  ``layout.groups.group_size`` layers: every layer unless the model declares attention windows).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from attrs import field, frozen

from metrale_core.errors import ConfigError
from metrale_core.model_api import KVLayout, ModelInfo

__all__ = ["EngineConfig"]


def _positive(instance, attribute, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"EngineConfig.{attribute.name} must be a positive integer, got {value!r}")


def _optional_positive(instance, attribute, value) -> None:
    if value is not None:
        _positive(instance, attribute, value)


def _optional_positive_float(instance, attribute, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
        raise ConfigError(f"EngineConfig.{attribute.name} must be a positive number of seconds, got {value!r}")


def _name(instance, attribute, value) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"EngineConfig.{attribute.name} must be a non-empty component name, got {value!r}")


def _optional_bool(instance, attribute, value) -> None:
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"EngineConfig.{attribute.name} must be True, False or None (auto), got {value!r}")


def _option_keys(instance, attribute, value) -> None:
    bad = [key for key in value if not isinstance(key, str) or not key]
    if bad:
        raise ConfigError(f"EngineConfig.{attribute.name} keys must be non-empty flag dests, got {bad!r}")


def _optional_name(instance, attribute, value) -> None:
    if value is not None:
        _name(instance, attribute, value)


def _callable(instance, attribute, value) -> None:
    if not callable(value):
        raise ConfigError(f"EngineConfig.{attribute.name} must be a callable returning seconds")


@frozen
class EngineConfig:
    """How one engine sizes its pools and schedules its requests."""

    #: Tokens per KV block.
    block_size: int = field(default=16, validator=_positive)
    #: Byte budget of the paged K/V pool (ignored when ``num_kv_blocks`` is set).
    kv_cache_memory: int = field(default=256 << 20, validator=_positive)
    #: Exact number of KV blocks; overrides ``kv_cache_memory``.
    num_kv_blocks: int | None = field(default=None, validator=_optional_positive)
    #: Token budget of the prefill chunks of one step (a longer prompt is split across steps).
    max_prefill_tokens: int = field(default=8192, validator=_positive)
    #: Most sequences running at once (also the most recurrent-state slots).
    max_num_seqs: int = field(default=128, validator=_positive)
    #: Byte budget of the recurrent-state pool of a model with recurrent layers: the pool gets
    #: ``min(max_num_seqs, recurrent_state_memory // bytes_per_sequence)`` slots, and sequences
    #: beyond that wait for a slot (see ``num_state_slots_for``).
    recurrent_state_memory: int = field(default=4 << 30, validator=_positive)
    #: Longest sequence (prompt + output); None means the model's ``max_position``.
    max_model_len: int | None = field(default=None, validator=_optional_positive)
    #: Prefix caching; None means on exactly when the model keeps no recurrent state.
    enable_prefix_caching: bool | None = field(default=None, validator=_optional_bool)
    #: Default per-request wall-clock limit in seconds (None = no limit).
    request_timeout_s: float | None = field(default=None, validator=_optional_positive_float)
    #: Registered scheduling policy name.
    scheduler: str = field(default="fcfs", validator=_name)
    #: Registered sampler name.
    sampler: str = field(default="default", validator=_name)
    #: KV-cache storage dtype: None = the model dtype; "fp32" / "fp16" / "bf16" (core) or a
    #: plugin dtype such as "fp8" (metrale-fp8); see ``metrale_core.engine.kv_dtype``.
    kv_cache_dtype: str | None = field(default=None, validator=_optional_name)
    #: Monotonic clock in seconds (tests inject a fake one).
    clock: Callable[[], float] = field(default=time.monotonic, validator=_callable, repr=False)
    #: Values of the flags plugins add through the ``metrale_engine_flags`` hook, keyed by each
    #: flag's argparse ``dest`` (``{"dry_multiplier": 0.8}``); a plugin's factories read their own
    #: keys with ``.get(key, default)``, so an engine built without the CLI still works.
    plugin_options: dict = field(factory=dict, converter=dict, validator=_option_keys, hash=False)

    def num_blocks_for(self, layout: KVLayout | None, max_model_len: int) -> int:
        """Blocks in the KV pool for ``layout``.

        A model without attention layers (``layout`` None) keeps no K/V; its pool is bookkeeping
        only and is sized so that ``max_num_seqs`` full-length sequences fit.
        """
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        if layout is None or layout.num_layers == 0:
            return self.max_num_seqs * -(-max_model_len // self.block_size)
        per_token = layout.bytes_per_page_token()
        blocks = self.kv_cache_memory // (self.block_size * per_token)
        if blocks < 1:
            raise ConfigError(
                f"kv_cache_memory={self.kv_cache_memory} bytes holds no block of {self.block_size} "
                f"tokens ({per_token} bytes per token); raise kv_cache_memory"
            )
        return blocks

    def num_state_slots_for(self, info: ModelInfo) -> int:
        """Recurrent-state slots: ``max_num_seqs`` capped by ``recurrent_state_memory`` (0 when
        the model keeps no recurrent state)."""
        if not info.has_recurrent_state or info.recurrent is None:
            return 0
        per_seq = max(1, info.recurrent.bytes_per_sequence)
        slots = min(self.max_num_seqs, self.recurrent_state_memory // per_seq)
        if slots < 1:
            raise ConfigError(
                f"recurrent_state_memory={self.recurrent_state_memory} bytes holds no sequence's "
                f"recurrent state ({per_seq} bytes for {info.architecture}); raise it"
            )
        return slots

    def resolve_max_model_len(self, info: ModelInfo) -> int:
        """The context limit: ``max_model_len`` capped by the model's ``max_position``."""
        if self.max_model_len is None:
            return info.max_position
        if self.max_model_len > info.max_position:
            raise ConfigError(
                f"max_model_len={self.max_model_len} exceeds the model's max_position={info.max_position}"
            )
        return self.max_model_len

    def resolve_prefix_caching(self, info: ModelInfo) -> bool:
        """Prefix caching is forced off for models with recurrent state (state is not in KV)."""
        if info.has_recurrent_state:
            return False
        return True if self.enable_prefix_caching is None else self.enable_prefix_caching
