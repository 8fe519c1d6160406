"""Shared pieces of the family tests (issue 31): loading through the registry, transformers'
references, and GGUF files written under llama.cpp's names.

Owner: ``plugins/metrale-qwen3/tests``.  Each family's test module keeps its own configs and its
own table of llama.cpp tensor names (a llama layer's from :mod:`metrale_core.testing.gguf_names`
plus its own entries, so a test does not read the definition's tables); what every family does
the same way lives here once.

Invariants:
- ``load_family`` goes through ``load_registry().find_model_loader`` -- the path ``met serve``
  takes -- and asserts the registry picked the family the test means.
- ``stepwise_reference`` decodes one token at a time over transformers' own KV cache, so a
  position-dependent RoPE (LongRoPE's switch at its original length) is compared step by step.
- ``gguf_header`` writes only the keys every llama.cpp decoder arch has; family keys are the
  caller's (``gguf_file``: the same writer as a block that writes the file at its end).
- ``engine_rows`` runs the real engine (requests joining mid-prefill, chunked prefill of 8
  tokens, blocks of 4) and records every logits row; ``assert_same_bits_alone_and_batched``
  compares one request's logits through the engine alone and beside others, bit for bit.
- ``assert_engine_matches_hf`` is the families' checkpoint oracle (every row within 1e-4 of
  transformers' stepwise decode, a KV pool that preempts unless windows forbid it);
  ``assert_stored_weights_match_hf`` the GGUF one (within 1e-4 under ``exact``, 2e-2 under a format that
  quantizes the activations, against transformers on the file's dequantized weights).
- GGUFs are written under llama.cpp's names from :mod:`metrale_core.testing.gguf_names`, a test
  table (never the definitions' own), each family adding or overriding its entries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import transformers as tf
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.plugin.components import LoadOptions
from metrale_core.plugin.discovery import load_registry
from metrale_core.sampling.params import SamplingParams
from metrale_core.testing.forward_spy import ForwardSpy
from metrale_core.testing.gguf_names import TOP
from metrale_core.testing.staggered import run_joining_mid_prefill

#: The families' random models: their vocabulary, and the config keys every one of them shares.
VOCAB = 96
BASE = dict(vocab_size=VOCAB, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
NEW_TOKENS = 16
PROMPTS = [
    [5, 17, 3, 88, 41, 9, 60],
    [2, 70, 33, 14, 95, 7, 50, 21, 11, 64, 3, 8],
    [44, 1, 90],
    [12, 12, 80, 6, 37, 58, 29, 71, 4, 66],
]


def load_family(family: str, store: Any, weight_format: str = "exact", **options: Any) -> Any:
    """The model the registry's loader for ``store`` builds, which must be ``family``'s."""
    spec = load_registry().find_model_loader(store.config)
    assert spec.name == family
    return spec.factory(store, LoadOptions(weight_format=weight_format, **options))


def match_request(full: list[list[int]], history: tuple) -> int:
    """The request whose tokens ``history`` is a prefix of (None: a position slid out of every
    window, matched on the known ones)."""
    return next(
        i
        for i, seq in enumerate(full)
        if len(seq) >= len(history) and all(h is None or h == t for h, t in zip(history, seq))
    )


def row_errors(rows: list, full: list[list[int]], ref: list) -> list[float]:
    """Per engine logits row (``rows``: ``(history, row)``), its largest difference from ``ref`` --
    per request, the reference logits after each history length -- of the request it belongs to."""
    return [float((row - ref[match_request(full, history)][len(history) - 1]).abs().max()) for history, row in rows]


def worst_row(rows: list, full: list[list[int]], ref: list) -> float:
    """The largest of :func:`row_errors` (0.0 for no rows)."""
    return max(row_errors(rows, full, ref), default=0.0)


def forward_reference(
    hf: Any, outputs: list[list[int]], prompts: list[list[int]] = PROMPTS
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Each request's whole sequence (``prompts`` + ``outputs``) and transformers' logits over it,
    in one forward (the last token's row left out)."""
    full = [p + o for p, o in zip(prompts, outputs)]
    with torch.no_grad():
        return full, [hf(torch.tensor([seq[:-1]])).logits[0] for seq in full]


def stepwise_reference(hf: Any, prompt: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' greedy tokens, decoded one step at a time over its own KV cache, and the
    logits row after every history length (index ``len(history) - 1``)."""
    cache = tf.DynamicCache(config=hf.config)
    tokens: list[int] = []
    with torch.no_grad():
        rows = list(hf(torch.tensor([prompt]), past_key_values=cache, use_cache=True).logits[0].float())
        for p in range(len(prompt), len(prompt) + NEW_TOKENS):
            tokens.append(int(rows[-1].argmax()))
            if p < len(prompt) + NEW_TOKENS - 1:
                step = hf(
                    torch.tensor([[tokens[-1]]]),
                    past_key_values=cache,
                    use_cache=True,
                    position_ids=torch.tensor([[p]]),
                )
                rows.append(step.logits[0, -1].float())
    return tokens, rows


def assert_rows_match_hf(hf: Any, outputs: list[list[int]], rows: list, generate: bool = True) -> None:
    """Every engine logits row (``rows``: ``(history, row)``) within 1e-4 of transformers' stepwise
    decode of its request, the greedy ``outputs`` equal to those steps' and (``generate``) to
    transformers' ``generate``."""
    refs = [stepwise_reference(hf, p) for p in PROMPTS]
    full = [p + o for p, o in zip(PROMPTS, outputs)]
    assert worst_row(rows, full, [steps for _, steps in refs]) <= 1e-4
    assert outputs == [tokens for tokens, _ in refs]
    if generate:
        assert outputs == [hf_generate(hf, p) for p in PROMPTS]


def hf_generate(hf: Any, prompt: list[int]) -> list[int]:
    """transformers' ``generate``, greedy, ``NEW_TOKENS`` long, EOS ignored."""
    ids = torch.tensor([prompt])
    hf.generation_config.eos_token_id = None  # as ignore_eos (min_new_tokens would mask EOS instead)
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, len(prompt) :].tolist()


def engine_rows(
    model: Any, max_tokens: int, blocks: int = 64, prompts: list[list[int]] = PROMPTS, **config: Any
) -> tuple[list[list[int]], list, LLMEngine]:
    """Greedy outputs of ``prompts`` through the engine (``blocks`` KV blocks of 4 tokens, prefill
    chunks of 8, requests joining mid-prefill; ``config``: more ``EngineConfig`` fields), every
    logits row with its history, the engine."""
    spy = ForwardSpy(model)
    settings = EngineConfig(block_size=4, num_kv_blocks=blocks, max_prefill_tokens=8, **config)
    engine = LLMEngine(spy, settings, registry=load_registry())
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outputs = run_joining_mid_prefill(engine, prompts, params)
    return outputs, spy.rows, engine


def assert_engine_matches_hf(hf: Any, model: Any, blocks: int, *, preempts: bool = True, generate: bool = True) -> None:
    """``PROMPTS`` through the engine on ``model`` (``blocks`` KV blocks of 4 tokens: too few for
    the four sequences at once, so the engine preempts, when ``preempts``), ``NEW_TOKENS`` each:
    :func:`assert_rows_match_hf` against ``hf``."""
    outputs, rows, engine = engine_rows(model, NEW_TOKENS, blocks=blocks)
    assert not preempts or engine.stats().num_preemptions > 0
    assert_rows_match_hf(hf, outputs, rows, generate)


def assert_stored_weights_match_hf(hf: Any, model: Any, weight_format: str, max_tokens: int = 4) -> list[list[int]]:
    """Every engine logits row of ``model`` (loaded in ``weight_format`` from a file of quantized
    blocks: a GGUF, an MXFP4 checkpoint) within 1e-4 of ``hf`` (on the file's dequantized
    weights) under ``exact``, within the activations'
    quantization (2e-2) under a format that multiplies on the file's blocks; the greedy outputs."""
    outputs, rows, _ = engine_rows(model, max_tokens)
    assert worst_row(rows, *forward_reference(hf, outputs)) <= (1e-4 if weight_format == "exact" else 2e-2)
    return outputs


def load_gguf(
    path: Any, write: Callable[[Any], None], family: str, weight_format: str = "exact", arch: str | None = None
) -> Any:
    """``family``'s model from the GGUF at ``path`` (``write(path)`` first unless it exists); the
    file must declare ``arch`` (default: ``family``) as its model type."""
    from qwen3_harness import open_store

    if not path.exists():
        write(path)
    store = open_store(path)
    assert store.config["model_type"] == (arch or family)
    return load_family(family, store, weight_format)


Q8 = GGMLQuantizationType.Q8_0


def q8(a: np.ndarray) -> np.ndarray:
    """``a`` through Q8_0 and back (the values a Q8_0 file holds)."""
    return dequantize(quantize(a, Q8), Q8).reshape(a.shape)


def stored(a: np.ndarray, quantized: bool) -> dict:
    """``GGUFWriter.add_tensor``'s arguments for ``a``, in Q8_0 or as it is."""
    if quantized:
        return dict(tensor=quantize(np.ascontiguousarray(a), Q8), raw_dtype=Q8)
    return dict(tensor=np.ascontiguousarray(a))


def add_float_tensors(
    w: GGUFWriter, hf: Any, table: dict[str, str], adjust: Callable[[str, str, np.ndarray], np.ndarray] | None = None
) -> None:
    """``hf``'s tensors added to ``w`` as float32 under llama.cpp's names: :data:`TOP` outside the
    layers, ``table`` (a layer's module path -> llama.cpp's name) inside; ``adjust(module, name,
    a)`` may change a tensor's values first (the converter's permutations and offsets)."""
    for name, t in hf.state_dict().items():
        base, kind = name.rsplit(".", 1)
        if base in TOP:
            module, gname = base, f"{TOP[base]}.{kind}"
        else:
            i, module = base.removeprefix("model.layers.").split(".", 1)
            gname = f"blk.{i}.{table[module]}.{kind}"
        a = t.float().numpy()
        w.add_tensor(gname, np.ascontiguousarray(adjust(module, name, a) if adjust is not None else a))


def add_q8_moe_tensors(
    w: GGUFWriter,
    hf: Any,
    table: dict[str, str],
    quantized: Callable[[str, np.ndarray], bool],
    special: Callable[[GGUFWriter, str, str, str, np.ndarray], bool] | None = None,
) -> None:
    """``hf``'s tensors added to ``w`` under llama.cpp's names, as its converter writes an MoE:
    :data:`TOP` outside the layers, a layer's stacked experts (transformers 5: ``gate_up_proj``
    ``[E, 2I, D]``, ``down_proj`` ``[E, D, I]``) as ``ffn_{gate,up,down}_exps`` in Q8_0, the rest
    by ``table`` (a layer's module path -> llama.cpp's name); ``special(w, layer, path, kind, a)``
    may add a layer tensor its own way (True: done).  A tensor ``quantized(module, a)`` says is
    stored in Q8_0, and ``hf``'s weight becomes its dequantized values (the oracle's)."""
    with torch.no_grad():
        for name, t in hf.state_dict().items():
            a = t.float().numpy()
            base, kind = name.rsplit(".", 1)
            q = quantized(base, a)
            if q:
                a = q8(a)
                t.copy_(torch.from_numpy(a))
            if base in TOP:
                w.add_tensor(f"{TOP[base]}.{kind}", **stored(a, q))
                continue
            i, rest = base.removeprefix("model.layers.").split(".", 1)
            if special is not None and special(w, i, rest, kind, a):
                continue
            if rest == "mlp.experts" and kind == "gate_up_proj":
                gate, up = np.split(a, 2, axis=1)
                w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", **stored(gate, True))
                w.add_tensor(f"blk.{i}.ffn_up_exps.weight", **stored(up, True))
            elif rest == "mlp.experts":
                w.add_tensor(f"blk.{i}.ffn_down_exps.weight", **stored(a, True))
            else:
                w.add_tensor(f"blk.{i}.{table[rest]}.{kind}", **stored(a, q))


def gguf_header(
    path: Any,
    arch: str,
    config: Any,
    vocab: int,
    *,
    dense_ffn: bool = True,
    head_lengths: tuple[int, int, int] | None = None,
) -> GGUFWriter:
    """A writer for ``path`` holding the keys every decoder arch has, read from an HF config (the
    dense MLP's width unless ``dense_ffn`` is false; ``head_lengths``: the KV heads, key and value
    lengths where the arch writes others than the config's); the caller adds its family's keys
    and tensors, then ``finish_gguf``."""
    c = config.to_dict()
    w = GGUFWriter(str(path), arch)
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_head_count(c["num_attention_heads"])
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    kv_heads, key, value = head_lengths or (c["num_key_value_heads"], head_dim, head_dim)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(key)
    w.add_value_length(value)
    if dense_ffn:
        w.add_feed_forward_length(c["intermediate_size"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_rope_freq_base(c["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_token_list([f"t{i}" for i in range(vocab)])
    return w


def finish_gguf(w: GGUFWriter) -> None:
    """Write the header, the key-values and the tensors, and close the file."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@contextmanager
def gguf_file(path: Any, arch: str, config: Any, vocab: int, **header: Any) -> Iterator[GGUFWriter]:
    """:func:`gguf_header`'s writer for ``path`` (``header``: its keywords); the caller adds its
    family's keys and tensors inside the block, and the file is written and closed at its end."""
    w = gguf_header(path, arch, config, vocab, **header)
    yield w
    finish_gguf(w)


def assert_same_bits_alone_and_batched(model: Any) -> None:
    """A request's logits -- its prefill's and four decode steps' -- are the same bits when the
    engine runs it alone and beside two other requests (every prompt prefilled in one chunk, so
    the request's rows see the same shapes; KV groups and windows as the engine keeps them)."""

    def rows(prompts: list[list[int]]) -> dict[tuple, torch.Tensor]:
        spy = ForwardSpy(model)
        config = EngineConfig(block_size=4, num_kv_blocks=64, max_prefill_tokens=64)
        engine = LLMEngine(spy, config, registry=load_registry())
        params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
        run_joining_mid_prefill(engine, prompts, params, lead_steps=0)
        return {tuple(history): row for history, row in spy.rows if tuple(history[: len(prompts[0])]) == tuple(a)}

    a = PROMPTS[1]
    alone, batched = rows([a]), rows([a, PROMPTS[0], PROMPTS[3]])
    assert len(alone) == 5 and alone.keys() == batched.keys()
    for history, row in alone.items():
        assert torch.equal(row, batched[history]), len(history)
