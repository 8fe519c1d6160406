"""Test harness for metrale-speculative: tiny random checkpoints and engine runs to compare.

Owner: ``plugins/metrale-speculative/tests``.  Checkpoints are written with transformers'
random Qwen3 models (optionally with a DeepSeek-style MTP layer at index ``num_hidden_layers``)
and loaded through the registered ``qwen3`` loader exactly as the engine does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.sampling.params import SamplingParams
from metrale_core.testing.hf_random import randomize_

VOCAB = 48


class CharTokenizer:
    """One letter per token id, so stop strings work on random models."""

    eos_token_ids: tuple[int, ...] = ()

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + int(t) % 26) for t in ids)


def write_qwen3(
    directory: Path, seed: int, *, layers: int = 2, hidden: int = 32, mtp: bool = False, vocab: int = VOCAB
) -> Path:
    """A random Qwen3 checkpoint (no EOS) in ``directory``; with ``mtp`` an MTP layer too."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=None,
        bos_token_id=None,
        rope_theta=10000.0,
    )
    model = Qwen3ForCausalLM(config).eval()
    gen = randomize_(model, seed, weights=0.3)
    model.save_pretrained(directory)
    if mtp:
        _add_mtp_layer(directory, layers, hidden, gen)
    return directory


def _add_mtp_layer(directory: Path, index: int, hidden: int, gen: torch.Generator) -> None:
    """Append ``model.layers.<index>.{enorm,hnorm,eh_proj,shared_head,decoder layer}`` tensors."""
    path = directory / "model.safetensors"
    tensors = load_file(path)
    p = f"model.layers.{index}."
    for name, t in list(tensors.items()):
        if name.startswith("model.layers.0."):  # a decoder layer's shapes, fresh values
            noise = torch.randn(t.shape, generator=gen)
            tensors[p + name[len("model.layers.0.") :]] = (
                1.0 + 0.2 * noise if "norm" in name else 0.3 * noise
            ).contiguous()
    tensors[p + "enorm.weight"] = 1.0 + 0.1 * torch.randn(hidden, generator=gen)
    tensors[p + "hnorm.weight"] = 1.0 + 0.1 * torch.randn(hidden, generator=gen)
    # a weak but informative head: the block passes the token embedding through (zero attention
    # and MLP outputs), so it drafts a "bigram" guess through the shared head
    tensors[p + "eh_proj.weight"] = torch.cat([torch.eye(hidden), 0.05 * torch.randn(hidden, hidden, generator=gen)], 1)
    tensors[p + "self_attn.o_proj.weight"] = torch.zeros(hidden, 4 * 8)
    tensors[p + "mlp.down_proj.weight"] = torch.zeros(hidden, 2 * hidden)
    tensors[p + "shared_head.norm.weight"] = tensors["model.norm.weight"].clone()
    tensors[p + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file(tensors, path, metadata={"format": "pt"})


def write_perturbed(src: Path, directory: Path, seed: int, scale: float = 0.1) -> Path:
    """A draft checkpoint: ``src``'s config and weights plus noise (a stand-in for a smaller
    model distilled from the target: same vocabulary, mostly the same predictions)."""
    import shutil

    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", directory / "config.json")
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        name: (t + scale * t.std() * torch.randn(t.shape, generator=gen)).contiguous()
        for name, t in load_file(src / "model.safetensors").items()
    }
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def load(path: Path, registry: Any = None):
    """The model of a checkpoint through its registered loader (no tokenizer needed)."""
    from metrale_speculative.factories import load_checkpoint_model

    return load_checkpoint_model(path, registry)


def run(
    model,
    requests: list[tuple[str, list[int], SamplingParams]],
    *,
    speculator=None,
    registry=None,
    tokenizer=None,
    plain_ids: tuple[str, ...] = (),
    max_steps: int = 500,
    **config,
) -> dict[str, dict]:
    """Run ``requests`` to completion; per request: tokens, finish_reason, text, steps."""
    settings = dict(block_size=4, num_kv_blocks=256, max_num_seqs=8, max_prefill_tokens=64)
    settings.update(config)
    engine = LLMEngine(model, EngineConfig(**settings), tokenizer=tokenizer, registry=registry, speculator=speculator)
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params)
        if rid in plain_ids:
            engine.scheduler.seqs[rid].extras["speculative"] = False
    result = {rid: {"tokens": [], "finish_reason": None, "text": "", "steps": 0} for rid, _, _ in requests}
    steps = 0
    while engine.has_unfinished():
        steps += 1
        assert steps < max_steps, "engine did not finish"
        for out in engine.step():
            r = result[out.request_id]
            r["tokens"].extend(out.new_token_ids)
            r["text"] += out.text_delta
            r["steps"] += 1
            if out.finished:
                r["finish_reason"] = out.finish_reason
    result["_engine"] = engine
    return result


def streams(result: dict) -> dict:
    """The comparable part of a run (tokens, finish reason, text)."""
    return {rid: (r["tokens"], r["finish_reason"], r["text"]) for rid, r in result.items() if not rid.startswith("_")}
