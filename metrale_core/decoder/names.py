"""The weight-name table of a decoder definition: one row per slot, its HF and its GGUF name.

Owner: ``metrale_core.decoder``.  A slot is what the builder reads (``q``, ``mlp_norm``,
``embed`` ...); a row gives the slot's module path in a Hugging Face checkpoint and in a GGUF file
(llama.cpp's names), without the ``.weight`` / ``.bias`` suffix, ``{i}`` standing for the layer
(``{kind}`` where the suffix is part of a name: HF's ``e_score_correction_bias``).
:data:`LLAMA_NAMES` is the table of the Llama decoder; a family changes only the rows that differ
(``LLAMA_NAMES.replace(mlp_norm=(...))``).

Invariants:
- This module imports nothing but attrs (a plugin builds its definitions while it registers, and
  registering imports no torch); ``metrale_core.weights.gguf_hf`` derives the GGUF store's
  llama-table from :data:`LLAMA_NAMES`, so the two never disagree.
- A GGUF store presents tensors under HF names where its table knows them and under their GGUF
  names otherwise; :meth:`WeightNames.resolver` maps a slot to the name *that store* serves it
  under (the HF name the store gave its GGUF tensor, else the GGUF name itself), so a family whose
  GGUF names differ from llama's (Gemma's ``ffn_norm`` is its pre-MLP norm) reads the right tensor.
- An HF store without the table's embedding but with it under one of :data:`TEXT_PREFIXES` (a
  multimodal checkpoint, Gemma 3's) is read there: every ``model.`` name under that prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from attrs import field, frozen

__all__ = ["GEMMA_NAMES", "LAYER_SLOTS", "LLAMA_NAMES", "TEXT_PREFIXES", "TOP_SLOTS", "WeightNames"]

#: Where a multimodal HF checkpoint keeps its text decoder's ``model.`` tensors (transformers >= 4.52
#: writes ``model.language_model.``, older ones ``language_model.model.``).
TEXT_PREFIXES = ("model.language_model.", "language_model.model.")

#: Slots outside the layers.
TOP_SLOTS = ("embed", "norm", "head")
#: Slots of one layer.
LAYER_SLOTS = (
    "attn_norm",
    "qkv",
    "q",
    "k",
    "v",
    "o",
    "q_norm",
    "k_norm",
    "sinks",
    "attn_out_norm",
    "mlp_norm",
    "gate",
    "up",
    "gate_up",
    "down",
    "mlp_out_norm",
    # a sparse (MoE) layer: the router, routed expert {e}'s projections (a GGUF stacks the experts
    # in one tensor: expert e of it is served as ``name[e]``), the shared expert and its gate
    "router",
    "expert_gate",
    "expert_up",
    "expert_down",
    "shared_gate",
    "shared_up",
    "shared_down",
    "shared_expert_gate",
    # the router's selection-only correction bias (DeepSeek-V3's ``e_score_correction_bias``)
    "router_bias",
    # multi-head latent attention (``Attention(kind="mla")``): q straight (``q``) or through its
    # low-rank pair ``q_a`` / ``q_a_norm`` / ``q_b``; the joint latent + rope key ``kv_a`` and its
    # norm; the latent's up-projection ``kv_b`` (HF, and older GGUFs) or its two halves
    # ``k_b`` / ``v_b`` (llama.cpp's newer files)
    "q_a",
    "q_a_norm",
    "q_b",
    "kv_a",
    "kv_a_norm",
    "kv_b",
    "k_b",
    "v_b",
)

#: A slot's resolved tensor name: ``(slot, layer or None, "weight" | "bias"[, expert]) -> name``.
Resolver = Callable[..., str]


def _table(value: Mapping[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    table = {str(k): (str(hf), str(gguf)) for k, (hf, gguf) in value.items()}
    unknown = set(table) - set(TOP_SLOTS) - set(LAYER_SLOTS)
    if unknown:
        raise ValueError(f"unknown weight slots {sorted(unknown)} (slots: {TOP_SLOTS + LAYER_SLOTS})")
    return table


def _expert_name(template: str, layer: int | None, kind: str, expert: int | None) -> str:
    """``template`` for ``layer`` (and ``expert``): a template without ``{e}`` is a stacked tensor,
    whose expert ``e`` is named ``<tensor>[e]`` (``metrale_core.weights.ExpertSlices`` serves it).
    A template with ``{suffix}`` names a parameter without the ``.weight`` / ``.bias`` suffix
    (transformers' ``sinks``, gpt-oss's ``gate_up_proj`` / ``gate_up_proj_bias``): ``{suffix}`` is
    empty for the weight and ``_bias`` for the bias, and ``{e}`` inside it is the expert."""
    if "{suffix}" in template:
        return template.format(i=layer, e=expert, suffix="" if kind == "weight" else f"_{kind}")
    if "{kind}" in template:  # the kind is inside the name (``e_score_correction_bias``)
        name = template.format(i=layer, e=expert, kind=kind)
    else:
        name = f"{template.format(i=layer, e=expert)}.{kind}"
    return name if expert is None or "{e}" in template else f"{name}[{expert}]"


@frozen
class WeightNames:
    """slot -> ``(HF module path, GGUF module path)``; see the module docstring."""

    table: dict[str, tuple[str, str]] = field(converter=_table)

    def replace(self, **rows: tuple[str, str]) -> WeightNames:
        """This table with the given rows changed (or added)."""
        return WeightNames({**self.table, **rows})

    def hf(self, slot: str, layer: int | None = None, kind: str = "weight", expert: int | None = None) -> str:
        return _expert_name(self.table[slot][0], layer, kind, expert)

    def gguf(self, slot: str, layer: int | None = None, kind: str = "weight", expert: int | None = None) -> str:
        return _expert_name(self.table[slot][1], layer, kind, expert)

    def resolver(self, store: Any) -> Resolver:
        """The name each slot has in ``store`` (HF names, or a GGUF store's names; module docstring)."""
        if getattr(store, "format", None) != "gguf":
            embed = self.hf("embed")
            has = getattr(store, "__contains__", None)
            if has is None or not embed.startswith("model.") or has(embed):
                return self.hf
            rest = embed.removeprefix("model.")
            prefix = next((p for p in TEXT_PREFIXES if has(p + rest)), None)
            if prefix is None:
                return self.hf

            def nested(slot: str, layer: int | None = None, kind: str = "weight", expert: int | None = None) -> str:
                name = self.hf(slot, layer, kind, expert)
                return prefix + name.removeprefix("model.") if name.startswith("model.") else name

            return nested
        served = {gguf: hf for hf, gguf in store.gguf_names.items()}

        def name(slot: str, layer: int | None = None, kind: str = "weight", expert: int | None = None) -> str:
            gguf = self.gguf(slot, layer, kind, expert)
            return served.get(gguf, gguf)

        return name


LLAMA_NAMES = WeightNames(
    {
        "embed": ("model.embed_tokens", "token_embd"),
        "norm": ("model.norm", "output_norm"),
        "head": ("lm_head", "output"),
        "attn_norm": ("model.layers.{i}.input_layernorm", "blk.{i}.attn_norm"),
        "qkv": ("model.layers.{i}.self_attn.qkv_proj", "blk.{i}.attn_qkv"),
        "q": ("model.layers.{i}.self_attn.q_proj", "blk.{i}.attn_q"),
        "k": ("model.layers.{i}.self_attn.k_proj", "blk.{i}.attn_k"),
        "v": ("model.layers.{i}.self_attn.v_proj", "blk.{i}.attn_v"),
        "o": ("model.layers.{i}.self_attn.o_proj", "blk.{i}.attn_output"),
        "q_norm": ("model.layers.{i}.self_attn.q_norm", "blk.{i}.attn_q_norm"),
        "k_norm": ("model.layers.{i}.self_attn.k_norm", "blk.{i}.attn_k_norm"),
        "sinks": ("model.layers.{i}.self_attn.sinks{suffix}", "blk.{i}.attn_sinks"),
        # the norm after attention's output (Gemma, OLMo 2); llama's "post_attention_layernorm"
        # is its pre-MLP norm, the next row
        "attn_out_norm": ("model.layers.{i}.post_attention_layernorm", "blk.{i}.post_attention_norm"),
        "mlp_norm": ("model.layers.{i}.post_attention_layernorm", "blk.{i}.ffn_norm"),
        "gate": ("model.layers.{i}.mlp.gate_proj", "blk.{i}.ffn_gate"),
        "up": ("model.layers.{i}.mlp.up_proj", "blk.{i}.ffn_up"),
        "gate_up": ("model.layers.{i}.mlp.gate_up_proj", "blk.{i}.ffn_gate_up"),
        "down": ("model.layers.{i}.mlp.down_proj", "blk.{i}.ffn_down"),
        "mlp_out_norm": ("model.layers.{i}.post_feedforward_layernorm", "blk.{i}.post_ffw_norm"),
        "router": ("model.layers.{i}.mlp.gate", "blk.{i}.ffn_gate_inp"),
        "expert_gate": ("model.layers.{i}.mlp.experts.{e}.gate_proj", "blk.{i}.ffn_gate_exps"),
        "expert_up": ("model.layers.{i}.mlp.experts.{e}.up_proj", "blk.{i}.ffn_up_exps"),
        "expert_down": ("model.layers.{i}.mlp.experts.{e}.down_proj", "blk.{i}.ffn_down_exps"),
        "shared_gate": ("model.layers.{i}.mlp.shared_expert.gate_proj", "blk.{i}.ffn_gate_shexp"),
        "shared_up": ("model.layers.{i}.mlp.shared_expert.up_proj", "blk.{i}.ffn_up_shexp"),
        "shared_down": ("model.layers.{i}.mlp.shared_expert.down_proj", "blk.{i}.ffn_down_shexp"),
        "shared_expert_gate": ("model.layers.{i}.mlp.shared_expert_gate", "blk.{i}.ffn_gate_inp_shexp"),
        "router_bias": ("model.layers.{i}.mlp.gate.e_score_correction_{kind}", "blk.{i}.exp_probs_b"),
        "q_a": ("model.layers.{i}.self_attn.q_a_proj", "blk.{i}.attn_q_a"),
        "q_a_norm": ("model.layers.{i}.self_attn.q_a_layernorm", "blk.{i}.attn_q_a_norm"),
        "q_b": ("model.layers.{i}.self_attn.q_b_proj", "blk.{i}.attn_q_b"),
        "kv_a": ("model.layers.{i}.self_attn.kv_a_proj_with_mqa", "blk.{i}.attn_kv_a_mqa"),
        "kv_a_norm": ("model.layers.{i}.self_attn.kv_a_layernorm", "blk.{i}.attn_kv_a_norm"),
        "kv_b": ("model.layers.{i}.self_attn.kv_b_proj", "blk.{i}.attn_kv_b"),
        "k_b": ("model.layers.{i}.self_attn.k_b_proj", "blk.{i}.attn_k_b"),
        "v_b": ("model.layers.{i}.self_attn.v_b_proj", "blk.{i}.attn_v_b"),
    }
)

#: The Gemma 2 / Gemma 3 table: HF ``pre_feedforward_layernorm`` is the pre-MLP norm (GGUF
#: ``ffn_norm``); the post-norms are llama's rows ``attn_out_norm`` / ``mlp_out_norm``.
GEMMA_NAMES = LLAMA_NAMES.replace(mlp_norm=("model.layers.{i}.pre_feedforward_layernorm", "blk.{i}.ffn_norm"))
