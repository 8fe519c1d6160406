"""Benchmark: Metrale vs HF transformers ``generate`` on the embedded SmolLM2 GGUF, same run.

Prints single-stream decode tok/s, prefill tok/s for a 512-token prompt and 16-stream aggregate
decode tok/s for both, and the ratios. Not a test: run by hand.

    python bench/bench_generate.py [--threads 2] [--decode-tokens 64] [--no-hf]
"""

from __future__ import annotations

import argparse
import time

import torch
from bench_args import int_flags  # same folder


def engine_rate(model, prompt_ids, streams, new_tokens, prefill_only=False) -> float:
    """Metrale in-process: decode tok/s after the first token (or prefill tok/s), greedy."""
    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.sampling.params import SamplingParams

    engine = LLMEngine(
        model,
        EngineConfig(
            block_size=16,
            kv_cache_memory=1 << 30,
            max_prefill_tokens=1024,
            max_num_seqs=max(16, streams),
            enable_prefix_caching=False,
        ),
    )
    params = SamplingParams(temperature=0.0, max_tokens=1 if prefill_only else new_tokens, ignore_eos=True)
    for i in range(streams):
        engine.add_request(f"r{i}", list(prompt_ids), params)
    t0 = time.perf_counter()
    first, produced = None, 0
    while engine.has_unfinished():
        produced += sum(len(o.new_token_ids) for o in engine.step())
        if first is None and produced:
            first = time.perf_counter()
    end = time.perf_counter()
    if prefill_only:
        return len(prompt_ids) * streams / (end - t0)
    return (produced - streams) / (end - first)


def hf_rate(model, prompt_ids, streams, new_tokens, prefill_only=False):
    """HF ``model``'s tokens/s: prompt tokens of one forward (``prefill_only``), else decode tokens
    past the first of ``generate`` (its one-token run's time subtracted)."""
    ids = torch.tensor([prompt_ids] * streams)
    with torch.no_grad():
        if prefill_only:
            t0 = time.perf_counter()
            model(ids)
            return len(prompt_ids) * streams / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False, pad_token_id=2)
        t1 = time.perf_counter()
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=2)
        t2 = time.perf_counter()
    return (new_tokens - 1) * streams / ((t2 - t1) - (t1 - t0))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    int_flags(ap, threads=2, decode_tokens=64, streams=16)
    ap.add_argument("--no-hf", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from metrale_core.loading.embedded import default_model_path
    from metrale_core.loading.load import load_model

    path = default_model_path()
    loaded = load_model(path, progress=False)
    tok = loaded.tokenizer
    short = tok.encode("Once upon a time")
    long_ids = (tok.encode("The quick brown fox jumps over the lazy dog. ") * 60)[:512]

    rows = []
    m1 = engine_rate(loaded.model, short, 1, args.decode_tokens)
    mp = engine_rate(loaded.model, long_ids, 1, 1, prefill_only=True)
    m16 = engine_rate(loaded.model, short, args.streams, args.decode_tokens)
    rows.append(("metrale", m1, mp, m16))
    if not args.no_hf:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
        h1 = hf_rate(hf, short, 1, args.decode_tokens)
        hp = hf_rate(hf, long_ids, 1, 1, prefill_only=True)
        h16 = hf_rate(hf, short, args.streams, args.decode_tokens)
        rows.append(("hf-transformers", h1, hp, h16))
    print(f"SmolLM2-135M-Instruct Q4_1, {args.threads} threads, greedy")
    print(f"{'engine':<16} {'decode 1-stream':>16} {'prefill 512':>12} {f'decode {args.streams}-stream agg':>22}")
    for name, d1, p, d16 in rows:
        print(f"{name:<16} {d1:>12.1f} t/s {p:>8.1f} t/s {d16:>18.1f} t/s")
    if len(rows) == 2:
        (_, a, b, c), (_, x, y, z) = rows
        print(f"{'ratio':<16} {a / x:>14.2f}x {b / y:>10.2f}x {c / z:>20.2f}x")


if __name__ == "__main__":
    main()
