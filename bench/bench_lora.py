"""Benchmark: multi-LoRA decode throughput on the embedded SmolLM2 GGUF.

16 greedy streams split over 4 random rank-16 adapters (every q/k/v/o/gate/up/down projection)
vs the same 16 streams on the base model alone, same process, aggregate decode tok/s and their
ratio (target: >= 0.8x).  Not a test: run by hand.

    python bench/bench_lora.py [--threads 2] [--decode-tokens 32] [--streams 16] [--adapters 4]
"""

from __future__ import annotations

import argparse
import time

import torch
from bench_args import int_flags  # same folder

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def random_adapter(bank, rank: int, seed: int):
    from metrale_core.api import AdapterWeights

    gen = torch.Generator().manual_seed(seed)
    modules = {}
    for module, (_, part) in bank.targets.items():
        if module.rsplit(".", 1)[-1] in TARGETS:
            modules[module] = (
                0.02 * torch.randn(rank, part.in_features, generator=gen),
                0.02 * torch.randn(part.out_features, rank, generator=gen),
                2.0,
            )
    return AdapterWeights(f"random-{seed}", modules)


def rate(engine, prompt_ids, streams: int, new_tokens: int, adapters: list[str | None]) -> float:
    from metrale_core.api import ADAPTER_EXTRA, SamplingParams

    bank = engine.runner.lora
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    for i in range(streams):
        name = adapters[i % len(adapters)]
        extras = None if name is None else {ADAPTER_EXTRA: bank.key_for(name)}
        engine.add_request(f"r{time.monotonic_ns()}-{i}", list(prompt_ids), params, extras=extras)
    first, produced = None, 0
    while engine.has_unfinished():
        produced += sum(len(o.new_token_ids) for o in engine.step())
        if first is None and produced:
            first = time.perf_counter()
    return (produced - streams) / (time.perf_counter() - first)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    int_flags(ap, threads=2, decode_tokens=32, streams=16, adapters=4, rank=16, repeats=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.loading.embedded import default_model_path
    from metrale_core.loading.load import load_model
    from metrale_lora.engine_setup import enable_adapters

    loaded = load_model(default_model_path(), progress=False)
    engine = LLMEngine(
        loaded.model,
        EngineConfig(
            block_size=16,
            kv_cache_memory=1 << 30,
            max_prefill_tokens=1024,
            max_num_seqs=max(16, args.streams),
            enable_prefix_caching=False,
        ),
    )
    bank = enable_adapters(engine, args.adapters, args.rank)
    names = [f"a{i}" for i in range(args.adapters)]
    for i, name in enumerate(names):
        bank.register(name, random_adapter(bank, args.rank, seed=i))
    prompt = loaded.tokenizer.encode("Once upon a time")
    rate(engine, prompt, 2, 4, [None])  # warm-up
    base, lora = [], []
    for _ in range(args.repeats):  # interleaved, best of each: the machine is shared
        base.append(rate(engine, prompt, args.streams, args.decode_tokens, [None]))
        lora.append(rate(engine, prompt, args.streams, args.decode_tokens, names))
    b, m = max(base), max(lora)
    print(
        f"SmolLM2-135M-Instruct ({getattr(loaded.model.weights, 'weight_format', '?')}), "
        f"{args.threads} threads, {args.streams} streams, {args.decode_tokens} tokens, greedy"
    )
    print(f"base only            {b:8.1f} tok/s")
    print(f"{args.adapters} adapters rank {args.rank:<3}  {m:8.1f} tok/s")
    print(f"ratio                {m / b:8.2f}x (target >= 0.80x)")


if __name__ == "__main__":
    main()
