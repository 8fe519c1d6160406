"""Gemma 3 at TP=2 (a worker process, gloo on loopback) against TP=1 through the real engine path:
sliding-window and global layers, final soft-capping, an uneven MLP split (64 + 32 columns),
chunked prefill, batched decode and a forced preemption; logits within 1e-5, greedy tokens equal."""

from __future__ import annotations

from gemma3_harness import VOCAB, save_checkpoint

from metrale_core.plugin.components import LoadOptions
from metrale_core.testing.tp_oracle import assert_tp2_matches_tp1, run_engine, write_word_tokenizer

PROMPTS = [[(11 * i + 5 * j) % (VOCAB - 3) + 3 for j in range(8 + 5 * i)] for i in range(4)]


def _run(model):
    return run_engine(model, PROMPTS, num_kv_blocks=24, max_tokens=10)


def test_gemma3_tp2_matches_tp1_through_the_engine(tmp_path):
    save_checkpoint("window6-softcap", tmp_path)
    write_word_tokenizer(tmp_path, VOCAB)

    def one_kv_head_a_rank(model):
        assert model.info.kv.num_kv_heads == 1

    assert_tp2_matches_tp1(
        tmp_path, LoadOptions(weight_format="exact"), _run, atol=1e-5, check_split=one_kv_head_a_rank
    )
