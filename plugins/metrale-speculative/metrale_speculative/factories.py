"""Proposer factories: ``ProposerSpec.factory(ctx: ProposerContext) -> GatedSpeculator``.

Owner: ``metrale_speculative`` registers them; ``LLMEngine`` calls the one named by the
``speculative`` plugin option (``--speculative``) once, at construction.

Options read from ``ctx.config.plugin_options`` (the flags of ``metrale_engine_flags``):
``num_draft_tokens`` (k, default 4), ``draft_model`` (a checkpoint path), ``spec_gate``
("auto" or "force"), ``ngram_min`` / ``ngram_max`` (default 2 / 4).

Invariants: a missing or unusable option is a ``ConfigError`` that names the flag to fix.
"""

from __future__ import annotations

from typing import Any

from metrale_core.api import ConfigError
from metrale_speculative.gate import SpecGate
from metrale_speculative.ngram import NgramProposer
from metrale_speculative.speculator import GatedSpeculator

__all__ = ["DEFAULT_NUM_DRAFT_TOKENS", "make_draft", "make_mtp", "make_ngram"]

DEFAULT_NUM_DRAFT_TOKENS = 4


def _option(ctx: Any, key: str, default: Any) -> Any:
    value = ctx.config.plugin_options.get(key)
    return default if value is None else value


def _wrap(ctx: Any, proposer: Any) -> GatedSpeculator:
    k = int(_option(ctx, "num_draft_tokens", DEFAULT_NUM_DRAFT_TOKENS))
    if k < 1:
        raise ConfigError(f"--num-draft-tokens must be >= 1, got {k}")
    gate = str(_option(ctx, "spec_gate", "auto"))
    if gate not in ("auto", "force"):
        raise ConfigError(f"--spec-gate must be 'auto' or 'force', got {gate!r}")
    # a fresh SpecStats (the speculator's default): the factory runs once per engine, so the
    # counters are that engine's own
    return GatedSpeculator(proposer, k, gate=SpecGate(force=gate == "force"))


def _checkpoint(ctx: Any, what: str) -> str:
    path = ctx.config.plugin_options.get("draft_model")
    if not path:
        hint = (
            "the checkpoint that holds the MTP layer, usually the same as --model"
            if what == "mtp"
            else "a smaller checkpoint with the same tokenizer"
        )
        raise ConfigError(f"--speculative {what} needs --draft-model PATH ({hint})")
    return str(path)


def _draft_pool_blocks(ctx: Any, model: Any) -> int:
    """KV blocks for a drafter: the engine's byte budget, but never fewer than one full-length
    sequence needs."""
    config = ctx.config
    need = -(-ctx.max_model_len // config.block_size)
    return max(need, config.num_blocks_for(model.info.kv, ctx.max_model_len))


def make_ngram(ctx: Any) -> GatedSpeculator:
    """Prompt-lookup drafting (no model)."""
    return _wrap(ctx, NgramProposer(int(_option(ctx, "ngram_min", 2)), int(_option(ctx, "ngram_max", 4))))


def load_checkpoint_model(path: Any, registry: Any = None, like: Any = None) -> Any:
    """The model of checkpoint ``path`` through its registered loader (no tokenizer), with the
    dtype and device of model ``like`` when given: the core's ``model_from_store``, the
    function that loads the target.  (Engines load drafts through ``ProposerContext.load_model``
    with their own registry; this helper is for tests and scripts.)"""
    from metrale_core.api import LoadOptions, load_registry, model_device, model_from_store, open_weights

    registry = registry if registry is not None else load_registry()
    options = LoadOptions()
    if like is not None:
        options = LoadOptions(dtype=str(like.info.dtype).removeprefix("torch."), device=str(model_device(like)))
    return model_from_store(open_weights(path), options, registry)[1]


def make_draft(ctx: Any) -> GatedSpeculator:
    """A draft model loaded from ``--draft-model`` with the target's dtype and device."""
    from metrale_speculative.draft_model import DraftModelProposer

    draft = ctx.load_model(_checkpoint(ctx, "draft"))
    proposer = DraftModelProposer(
        draft, ctx.model.info, ctx.pipeline, num_blocks=_draft_pool_blocks(ctx, draft), block_size=ctx.config.block_size
    )
    return _wrap(ctx, proposer)


def make_mtp(ctx: Any) -> GatedSpeculator:
    """The checkpoint's own MTP layer (DeepSeek-style, at index ``num_hidden_layers``)."""
    from metrale_speculative.mtp import MtpProposer

    proposer = MtpProposer.from_checkpoint(
        _checkpoint(ctx, "mtp"),
        ctx.model,
        ctx.pipeline,
        max_model_len=ctx.max_model_len,
        block_size=ctx.config.block_size,
        load=ctx.load_model,
    )
    return _wrap(ctx, proposer)
