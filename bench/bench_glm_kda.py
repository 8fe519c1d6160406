"""Benchmark: metrale-glm-kda vs transformers' Glm5Next on a small random GLM-5.3 config, same run.

Prints prefill tok/s (``--streams`` prompts of ``--prompt-len`` tokens) and aggregate batched
decode tok/s for both, the ratios, and the recurrent-state bytes per sequence of the bench
config and of the real GLM-5.3-Flash config.  Not a test: run by hand.

    python bench/bench_glm_kda.py [--threads 2] [--prompt-len 256] [--streams 4] [--decode-tokens 32]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from bench_args import int_flags  # same folder

TEXT = dict(
    vocab_size=2048,
    hidden_size=256,
    intermediate_size=512,
    moe_intermediate_size=128,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_routed_experts=16,
    n_shared_experts=1,
    num_experts_per_tok=4,
    kv_lora_rank=64,
    q_lora_rank=96,
    qk_nope_head_dim=32,
    v_head_dim=32,
    qk_rope_head_dim=0,
    index_topk=64,
    index_head_dim=32,
    index_n_heads=8,
    index_kpool=8,
    linear_num_heads=4,
    linear_head_dim=64,
    hc_mult=4,
    layer_types=["linear_attention"] * 3 + ["indexed_attention"] + ["linear_attention"] * 3 + ["indexed_attention"],
    mlp_layer_types=["dense"] + ["sparse"] * 7,
    max_position_embeddings=4096,
    pad_token_id=0,
)
VISION = dict(
    depth=1, hidden_size=16, num_heads=2, intermediate_size=16, out_hidden_size=256, projection_intermediate_size=16
)


def _engine_run(model, prompts, new_tokens):
    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.sampling.params import SamplingParams

    engine = LLMEngine(
        model,
        EngineConfig(block_size=16, kv_cache_memory=256 << 20, max_prefill_tokens=4096, max_num_seqs=len(prompts)),
    )
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    t0 = time.perf_counter()
    engine.step()  # every prompt fits one prefill step
    t1 = time.perf_counter()
    produced = 0
    while engine.has_unfinished():
        produced += sum(len(o.new_token_ids) for o in engine.step())
    t2 = time.perf_counter()
    return sum(map(len, prompts)) / (t1 - t0), produced / (t2 - t1)


def _hf_run(model, prompts, new_tokens):
    ids = torch.tensor(prompts)
    with torch.no_grad():
        t0 = time.perf_counter()
        model(ids)
        t1 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False, pad_token_id=0)
        t2 = time.perf_counter()
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        t3 = time.perf_counter()
    return ids.numel() / (t1 - t0), (new_tokens - 1) * len(prompts) / ((t3 - t2) - (t2 - t1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    int_flags(ap, threads=2, prompt_len=256, streams=4, decode_tokens=32)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration

    from metrale_core.plugin.components import LoadOptions
    from metrale_core.plugin.discovery import load_registry
    from metrale_core.weights import open_weights
    from metrale_glm_kda.config import GlmDims
    from metrale_glm_kda.state import state_bytes_per_sequence

    torch.manual_seed(0)
    hf = Glm5NextForConditionalGeneration(Glm5NextConfig(text_config=TEXT, vision_config=VISION)).eval()
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        store = open_weights(tmp)
        model = load_registry().find_model_loader(store.config).factory(store, LoadOptions())
    g = torch.Generator().manual_seed(1)
    prompts = [
        torch.randint(1, TEXT["vocab_size"], (args.prompt_len,), generator=g).tolist() for _ in range(args.streams)
    ]
    _engine_run(model, [p[:32] for p in prompts], 2)  # warm-up
    ours = _engine_run(model, prompts, args.decode_tokens)
    theirs = _hf_run(hf, prompts, args.decode_tokens)
    print(f"config: {model!r}")
    print(
        f"{args.streams} streams x {args.prompt_len}-token prompts, {args.decode_tokens} decode tokens, "
        f"{args.threads} threads"
    )
    print(f"{'':12}{'metrale':>12}{'transformers':>14}{'ratio':>8}")
    for label, a, b in (("prefill", ours[0], theirs[0]), ("decode", ours[1], theirs[1])):
        print(f"{label + ' tok/s':12}{a:12.1f}{b:14.1f}{a / b:8.2f}")
    small = model.info.recurrent.bytes_per_sequence
    real = GlmDims.from_config(
        {
            "model_type": "glm5_next",
            "q_lora_rank": 1536,
            "vocab_size": 154880,
            "hidden_size": 4096,
            "num_hidden_layers": 45,
        }
    )
    print(
        f"recurrent state per sequence: bench config {small / 1024:.1f} KiB; "
        f"GLM-5.3-Flash (34 KDA layers, bf16 conv) {state_bytes_per_sequence(real, torch.bfloat16) / 2**20:.1f} MiB"
    )


if __name__ == "__main__":
    main()
