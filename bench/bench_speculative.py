"""Benchmark: speculative decoding vs plain decode on the embedded SmolLM2 GGUF, same run.

Workloads: a repetitive code-editing prompt (the model is given code and asked to rewrite it,
so n-gram lookup finds what it copies) and a free-text prompt; batch widths 1 and 4.
Proposers: n-gram (k=4) and a draft model (SmolLM2 as its own draft, k=3: every draft is
accepted, so it shows the pure cost of drafting with a model as large as the target).  Greedy,
so the outputs must equal plain decode's (checked).  Prints delivered tok/s (committed tokens /
decode wall time), acceptance length (tokens committed per verify) and the speed-up.

    python bench/bench_speculative.py [--threads 2] [--tokens 64] [--gate auto|force]
"""

from __future__ import annotations

import argparse
import time

import torch
from bench_args import int_flags  # same folder

CODE = """def area(width, height):
    return width * height


def perimeter(width, height):
    return 2 * (width + height)


def describe(width, height):
    return f"{width}x{height}: area {area(width, height)}, perimeter {perimeter(width, height)}"
"""
PROMPTS = {
    "code-edit": f"Rename the parameter width to w everywhere in this code and print the whole "
    f"code again:\n\n{CODE}\nHere is the code with width renamed to w:\n\n",
    "free-text": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def run(model, tok, prompt_ids, width, tokens, speculator):
    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.sampling.params import SamplingParams

    engine = LLMEngine(
        model,
        EngineConfig(block_size=16, kv_cache_memory=1 << 29, max_prefill_tokens=2048),
        tokenizer=tok,
        speculator=speculator,
    )
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    for i in range(width):
        engine.add_request(f"r{i}", prompt_ids, params)
    out: dict[str, list[int]] = {}
    first = None
    while engine.has_unfinished():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
        if first is None:  # the prefill step sampled the first tokens
            first = time.perf_counter()
    seconds = time.perf_counter() - first
    decoded = sum(len(v) for v in out.values()) - width
    stats = engine.spec_driver.speculator.stats.snapshot() if engine.spec_driver else None
    return out, decoded / seconds, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    int_flags(parser, threads=2, tokens=64)
    parser.add_argument("--gate", choices=("auto", "force"), default="force")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from metrale_core.loading.load import load_model
    from metrale_speculative.draft_model import DraftModelProposer
    from metrale_speculative.gate import SpecGate
    from metrale_speculative.ngram import NgramProposer
    from metrale_speculative.speculator import GatedSpeculator

    loaded = load_model(None, progress=False)
    model, tok = loaded.model, loaded.tokenizer
    gate = lambda: SpecGate(force=args.gate == "force", window_steps=4)
    proposers = {
        "ngram k=4": lambda ctx: GatedSpeculator(NgramProposer(2, 4), 4, gate=gate()),
        "draft(self) k=3": lambda ctx: GatedSpeculator(
            DraftModelProposer(ctx.model, ctx.model.info, ctx.pipeline, num_blocks=256, block_size=16), 3, gate=gate()
        ),
    }
    print(f"SmolLM2-135M Q4_1, CPU threads={args.threads}, greedy, {args.tokens} tokens/stream, gate={args.gate}")
    print(
        f"{'workload':<10} {'width':>5} {'proposer':<16} {'tok/s':>8} {'plain':>8} {'speedup':>8} "
        f"{'acc.len':>7} {'acc.rate':>8}"
    )
    for name, text in PROMPTS.items():
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))
        for width in (1, 4):
            plain, plain_rate, _ = run(model, tok, ids, width, args.tokens, None)
            for pname, factory in proposers.items():
                got, rate, stats = run(model, tok, ids, width, args.tokens, factory)
                assert got == plain, f"{pname} changed the greedy output"
                print(
                    f"{name:<10} {width:>5} {pname:<16} {rate:8.1f} {plain_rate:8.1f} "
                    f"{rate / plain_rate:7.2f}x {stats['acceptance_length']:7.2f} "
                    f"{stats['acceptance_rate']:8.2f}"
                )


if __name__ == "__main__":
    main()
