"""The weight-name table (``metrale_core.decoder.names``): HF and GGUF names, resolved per store."""

from __future__ import annotations

import pytest

from metrale_core.decoder.names import LAYER_SLOTS, LLAMA_NAMES, TEXT_PREFIXES, TOP_SLOTS, WeightNames
from metrale_core.weights.gguf_hf import hf_name


def test_a_slot_has_an_hf_and_a_gguf_name():
    assert LLAMA_NAMES.hf("q", 3) == "model.layers.3.self_attn.q_proj.weight"
    assert LLAMA_NAMES.gguf("q", 3, "bias") == "blk.3.attn_q.bias"
    assert LLAMA_NAMES.hf("head") == "lm_head.weight" and LLAMA_NAMES.gguf("embed") == "token_embd.weight"
    assert set(LLAMA_NAMES.table) == set(TOP_SLOTS) | set(LAYER_SLOTS)


def test_replace_changes_only_the_rows_given_and_unknown_slots_are_errors():
    gemma = LLAMA_NAMES.replace(mlp_norm=("model.layers.{i}.pre_feedforward_layernorm", "blk.{i}.ffn_norm"))
    assert gemma.hf("mlp_norm", 0) == "model.layers.0.pre_feedforward_layernorm.weight"
    assert gemma.table["q"] == LLAMA_NAMES.table["q"]
    assert LLAMA_NAMES.hf("mlp_norm", 0) == "model.layers.0.post_attention_layernorm.weight"  # unchanged
    with pytest.raises(ValueError, match="unknown weight slots"):
        WeightNames({"qproj": ("a", "b")})


@pytest.mark.parametrize("slot", ["embed", "norm", "head", "attn_norm", "q", "k", "v", "o", "q_norm", "k_norm"])
def test_the_gguf_stores_llama_table_is_the_definitions(slot):
    """``metrale_core.weights.gguf_hf`` maps a llama GGUF name to the definition's HF name."""
    layer = None if slot in TOP_SLOTS else 5
    assert hf_name(LLAMA_NAMES.gguf(slot, layer)) == LLAMA_NAMES.hf(slot, layer)
    for slot in ("mlp_norm", "gate", "up", "down"):
        assert hf_name(LLAMA_NAMES.gguf(slot, 2, "bias")) == LLAMA_NAMES.hf(slot, 2, "bias")


class _GGUFStore:
    """The two things a resolver reads from a GGUF store: its format and its name map."""

    format = "gguf"

    def __init__(self, gguf_names: dict[str, str]) -> None:
        self.gguf_names = gguf_names


def test_a_gguf_store_is_read_under_the_names_it_serves():
    # the store renamed llama-table tensors to HF names and kept the others' GGUF names
    store = _GGUFStore({"model.layers.0.post_attention_layernorm.weight": "blk.0.ffn_norm.weight"})
    gemma = LLAMA_NAMES.replace(mlp_norm=("model.layers.{i}.pre_feedforward_layernorm", "blk.{i}.ffn_norm"))
    name = gemma.resolver(store)
    assert name("mlp_norm", 0, "weight") == "model.layers.0.post_attention_layernorm.weight"  # its ffn_norm
    assert name("attn_out_norm", 0, "weight") == "blk.0.post_attention_norm.weight"  # served as stored
    hf = gemma.resolver(object())  # any other store: HF names
    assert hf("mlp_norm", 0, "weight") == "model.layers.0.pre_feedforward_layernorm.weight"


class _HFStore:
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def __contains__(self, name: str) -> bool:
        return name in self.names


@pytest.mark.parametrize("prefix", TEXT_PREFIXES)
def test_a_multimodal_checkpoint_is_read_under_its_text_prefix(prefix):
    name = LLAMA_NAMES.resolver(_HFStore({prefix + "embed_tokens.weight"}))
    assert name("q", 2) == prefix + "layers.2.self_attn.q_proj.weight"
    assert name("embed") == prefix + "embed_tokens.weight" and name("norm") == prefix + "norm.weight"
    assert name("head") == "lm_head.weight"  # outside the text model: as the table says


def test_a_plain_checkpoint_keeps_the_table_names():
    name = LLAMA_NAMES.resolver(_HFStore({"model.embed_tokens.weight", "model.language_model.embed_tokens.weight"}))
    assert name("q", 0) == "model.layers.0.self_attn.q_proj.weight"
