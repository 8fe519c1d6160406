"""Benchmark: FP8 KV cache accuracy and capacity on the embedded SmolLM2 (not a test: run by hand).

Accuracy: 20 chat prompts.  The reference is a bf16 KV cache: each prompt is prefilled (one
forward per prompt, as requests arrive), then ``--decode-tokens`` greedy decode steps run over all
20 sequences together.  Every other KV configuration is teacher-forced on the reference tokens
through the same forwards, and reports

- greedy token agreement: the fraction of positions whose argmax equals the reference token;
- mean KL(P_bf16 || P_config) of the next-token distributions over those positions.

Configurations: fp32 KV (noise floor), fp8 calibrated (``--fp8-kv-calibration-tokens``, default
256), fp8 Unscaled (1.0 on every layer).  The model runs in float32; only the KV storage differs.

Capacity: the peak number of concurrently running sequences of an engine at a fixed
``--kv-cache-memory``, bf16 vs fp8 KV, with 64 requests of 32 prompt + 8 output tokens.

    python bench/bench_fp8.py [--threads 2] [--decode-tokens 32] [--calibration-tokens 256]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from bench_args import int_flags  # same folder

PROMPTS = [
    "What is the capital of France?",
    "Explain photosynthesis in one paragraph.",
    "Write a haiku about the sea.",
    "How do I reverse a list in Python?",
    "List three prime numbers greater than 50.",
    "What causes the seasons on Earth?",
    "Give me a recipe for pancakes.",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet.",
    "What is the difference between a virus and a bacterium?",
    "Write a short poem about autumn.",
    "How many legs does a spider have?",
    "Explain what a hash table is.",
    "Who wrote 'Pride and Prejudice'?",
    "Give two tips for better sleep.",
    "What is 17 multiplied by 23?",
    "Describe the water cycle.",
    "What does HTTP stand for?",
    "Tell me a fun fact about octopuses.",
]


class TeacherForcedRun:
    """One KV configuration: its own paged cache, contiguous blocks per sequence."""

    def __init__(self, model, storage, num_seqs: int, max_len: int, block_size: int = 16) -> None:
        from metrale_core.model_api import PagedKVCache

        self.model, self.bs = model, block_size
        self.blocks_per_seq = -(-max_len // block_size)
        self.kv = PagedKVCache.allocate(storage.layout, num_seqs * self.blocks_per_seq, block_size, codec=storage.codec)
        self.lens = [0] * num_seqs

    def forward(self, work: list[tuple[int, list[int]]]) -> torch.Tensor:
        """Feed ``tokens`` to each sequence; logits of each sequence's last row ``[B, V]``."""
        from metrale_core.model_api import ForwardBatch

        ids, pos, slots, qlens, clens, tables, rows = [], [], [], [], [], [], []
        for seq, toks in work:
            start = self.lens[seq]
            table = list(range(seq * self.blocks_per_seq, (seq + 1) * self.blocks_per_seq))
            ids += toks
            pos += range(start, start + len(toks))
            slots += [table[p // self.bs] * self.bs + p % self.bs for p in range(start, start + len(toks))]
            qlens.append(len(toks))
            clens.append(start + len(toks))
            tables.append(table)
            rows.append(len(ids) - 1)
            self.lens[seq] += len(toks)
        t = lambda xs: torch.tensor(xs, dtype=torch.int64)
        batch = ForwardBatch(
            input_ids=t(ids),
            positions=t(pos),
            query_start=t([0, *torch.tensor(qlens).cumsum(0).tolist()]),
            context_lens=t(clens),
            block_tables=t(tables),
            slot_mapping=t(slots),
            logits_rows=t(rows),
            state_slots=t([-1] * len(work)),
            state_fresh=torch.tensor([c == q for c, q in zip(clens, qlens)]),
            query_lens_host=tuple(qlens),
            context_lens_host=tuple(clens),
            block_size=self.bs,
        )
        return self.model.forward(batch, self.kv).float()


def storage_for(model, registry, kv_cache_dtype: str, **plugin_options):
    from metrale_core.engine import EngineConfig
    from metrale_core.engine.kv_dtype import resolve_kv_storage

    config = EngineConfig(kv_cache_dtype=kv_cache_dtype, plugin_options=plugin_options)
    return resolve_kv_storage(config, model, registry)


def run_config(model, storage, prompts, decode_tokens, forced=None):
    """Logits ``[decode_tokens, B, V]`` (one row per generated position) and the greedy tokens."""
    run = TeacherForcedRun(model, storage, len(prompts), max(map(len, prompts)) + decode_tokens)
    first = torch.cat([run.forward([(i, p)]) for i, p in enumerate(prompts)])
    logits, tokens = [first], [first.argmax(-1)]
    for step in range(1, decode_tokens):
        feed = forced[step - 1] if forced is not None else tokens[-1]
        out = run.forward([(i, [int(feed[i])]) for i in range(len(prompts))])
        logits.append(out)
        tokens.append(out.argmax(-1))
    return torch.stack(logits), torch.stack(tokens)


def compare(ref_logits, ref_tokens, logits) -> tuple[float, float]:
    agreement = float((logits.argmax(-1) == ref_tokens).float().mean())
    ref_lp, lp = F.log_softmax(ref_logits, -1), F.log_softmax(logits, -1)
    kl = float((ref_lp.exp() * (ref_lp - lp)).sum(-1).mean())
    return agreement, kl


def capacity(model, registry, kv_cache_dtype: str, memory: int, requests: int) -> tuple[int, int, float]:
    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.sampling.params import SamplingParams

    config = EngineConfig(
        block_size=16,
        kv_cache_memory=memory,
        max_num_seqs=512,
        kv_cache_dtype=kv_cache_dtype,
        enable_prefix_caching=False,
        plugin_options={"fp8_kv_calibration_tokens": 0},
    )
    engine = LLMEngine(model, config, registry=registry)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    for i in range(requests):
        engine.add_request(f"r{i}", [(i * 31 + j * 7) % 40000 + 100 for j in range(32)], params)
    peak, t0 = 0, time.perf_counter()
    while engine.has_unfinished():
        engine.step()
        peak = max(peak, engine.stats().num_running)
    return peak, engine.stats().num_blocks, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    int_flags(parser, threads=2, decode_tokens=32, calibration_tokens=256)
    parser.add_argument("--kv-cache-memory", type=int, default=16 << 20)
    parser.add_argument("--capacity-requests", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from loguru import logger

    from metrale_core.loading.embedded import default_model_path
    from metrale_core.loading.load import load_model
    from metrale_core.plugin.discovery import load_registry

    logger.remove()
    logger.add(lambda m: print("   log:", m, end=""), level="WARNING", format="{message}")
    registry = load_registry()
    loaded = load_model(default_model_path(progress=False), registry=registry, progress=False)
    model, tok = loaded.model, loaded.tokenizer
    prompts = [
        tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]), add_special_tokens=False) for p in PROMPTS
    ]
    print(
        f"SmolLM2-135M (float32 activations), {len(prompts)} prompts "
        f"({sum(map(len, prompts))} prompt tokens), {args.decode_tokens} positions each"
    )

    t0 = time.perf_counter()
    ref_logits, ref_tokens = run_config(model, storage_for(model, registry, "bf16"), prompts, args.decode_tokens)
    print(f"reference bf16 KV: {time.perf_counter() - t0:.1f}s")
    configs = [
        ("fp32 KV (noise floor)", storage_for(model, registry, "fp32")),
        (
            f"fp8 calibrated ({args.calibration_tokens} tokens)",
            storage_for(model, registry, "fp8", fp8_kv_calibration_tokens=args.calibration_tokens),
        ),
        ("fp8 Unscaled (1.0)", storage_for(model, registry, "fp8", fp8_kv_calibration_tokens=0)),
    ]
    print(f"{'KV cache vs bf16 KV':<34} {'greedy agreement':>17} {'mean KL (nats)':>15}")
    for name, storage in configs:
        logits, _ = run_config(model, storage, prompts, args.decode_tokens, forced=ref_tokens)
        agreement, kl = compare(ref_logits, ref_tokens, logits)
        print(f"{name:<34} {agreement:>17.4f} {kl:>15.3e}")

    print(
        f"capacity at --kv-cache-memory {args.kv_cache_memory} bytes "
        f"({args.capacity_requests} requests of 32 + 8 tokens):"
    )
    peaks = {}
    for dtype in ("bf16", "fp8"):
        peak, blocks, seconds = capacity(model, registry, dtype, args.kv_cache_memory, args.capacity_requests)
        peaks[dtype] = peak
        print(f"  {dtype:<5} {blocks:>5} blocks of 16 tokens, max concurrent sequences {peak:>4} ({seconds:.1f}s)")
    print(f"  ratio fp8 / bf16: {peaks['fp8'] / peaks['bf16']:.2f}x")


if __name__ == "__main__":
    main()
