"""Gemma's chat format: its template (as the instruction-tuned GGUFs and ``tokenizer_config.json``
ship it) rendered and tokenized by the core's tokenizer on a Gemma-style SentencePiece vocabulary,
and ``<end_of_turn>`` among the ids that end generation, for GGUFs with and without an EOT key."""

from __future__ import annotations

import pytest

from metrale_core.text.tokenizer import Tokenizer
from metrale_gemma3.config import Gemma3Dims

#: Gemma 3's chat template (the instruction-tuned checkpoints' ``chat_template``, text parts only).
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {{- message['content'] | trim }}
    {{- '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "\n"]
PIECES = ["▁", "u", "s", "e", "r", "m", "o", "d", "l", "h", "i", "y", "b", "▁hi", "user", "model", "yo", "be", "▁be"]


def _meta(**extra) -> dict:
    tokens = SPECIAL + [f"<0x{b:02X}>" for b in range(256)] + PIECES
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * (len(SPECIAL) + 256) + [float(len(p)) for p in PIECES],
        "tokenizer.ggml.token_type": [3, 3, 3, 2, 3, 3, 4] + [6] * 256 + [1] * len(PIECES),
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_space_prefix": False,
        "tokenizer.chat_template": GEMMA3_TEMPLATE,
        **extra,
    }


def test_the_gemma_template_renders_turns_and_tokenizes_the_markers_whole():
    tok = Tokenizer.from_gguf_metadata(_meta())
    conv = [
        {"role": "system", "content": "be"},
        {"role": "user", "content": " hi "},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "hi"},
    ]
    text = tok.apply_chat_template(conv, add_generation_prompt=True)
    assert text == (
        "<bos><start_of_turn>user\nbe\n\nhi<end_of_turn>\n"
        "<start_of_turn>model\nyo<end_of_turn>\n"
        "<start_of_turn>user\nhi<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    ids = tok.encode_chat(conv)
    start, end, newline = 4, 5, 6
    assert ids[0] == 2 and ids.count(start) == 4 and ids.count(end) == 3  # BOS once, markers whole
    assert ids[-1] == newline and tok.decode(ids, skip_special_tokens=False) == text
    with pytest.raises(Exception, match="alternate"):
        tok.apply_chat_template([{"role": "assistant", "content": "yo"}])


def _config() -> dict:
    return {
        "model_type": "gemma3",
        "vocab_size": len(SPECIAL) + 256 + len(PIECES),
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "eos_token_id": 1,
        "rope_theta": 1_000_000.0,
    }


@pytest.mark.parametrize("eot_key", [None, 5], ids=["by-text", "eot-key"])
def test_end_of_turn_ends_generation_besides_eos(eot_key):
    meta = {**_meta(), "general.architecture": "gemma3", "gemma3.attention.sliding_window": 512}
    if eot_key is not None:
        meta["tokenizer.ggml.eot_token_id"] = eot_key
    assert Gemma3Dims.from_gguf(_config(), meta).eos_token_ids == (1, 5)
