"""A byte-level tokenizer on disk with ChatML specials, tool-call and think tags and a template.

Owner: the tests that need a real HF tokenizer without a download (the server tests'
``server_testlib``, :mod:`metrale_core.testing.tiny_llama`'s checkpoint).

Invariants:
- One token per byte (ids 0-255, GPT-2's byte-to-unicode alphabet, no merges), then the specials
  :data:`SPECIAL` and the plain added tokens :data:`ADDED`, in that order; EOS ``<|im_end|>``, pad
  ``<|endoftext|>``, no BOS.  Any text round-trips.
- The chat template is :data:`CHATML` (system, tools, tool calls and responses, and the empty
  think block when ``enable_thinking`` is false).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["ADDED", "CHATML", "SPECIAL", "write_tokenizer"]

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<think>", "</think>"]

CHATML = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'system' and loop.first %}"
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}'
    "\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)


def write_tokenizer(
    directory: Path,
    special: list[str] = SPECIAL,
    added: list[str] = ADDED,
    chat_template: str = CHATML,
    eos: str = "<|im_end|>",
    generation_eos: tuple[str, ...] = (),
) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory``; returns it.
    Another chat format's tokens instead of ChatML's: ``special`` tokens (the first is the pad),
    ``added`` plain tokens, its template, EOS, and the extra end-of-generation tokens of a
    ``generation_config.json``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from metrale_core.text.tokenizer import _bytes_to_unicode

    directory.mkdir(parents=True, exist_ok=True)
    table = _bytes_to_unicode()
    tok = Tokenizer(models.BPE(vocab={table[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    tok.save(str(directory / "tokenizer.json"))
    config = {"eos_token": eos, "pad_token": special[0], "bos_token": None, "chat_template": chat_template}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    if generation_eos:
        ids = [tok.token_to_id(t) for t in (eos, *generation_eos)]
        (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": ids}))
    return directory
