"""The embedded SmolLM2-135M-Instruct GGUF's tokenizer as test data: known token ids, shared by the
tests that pin them, and the tokenizer as HF files for checkpoints that need a real one.

Owner: tests only.  Invariants: the ids are what the GGUF's own tokenizer and chat template give
(``tests/text/test_chat_template.py`` checks them against transformers' template), so a test
that feeds them to the model feeds exactly what ``met serve`` would.  :func:`save_hf_tokenizer`
writes the GGUF's vocabulary and merges with SmolLM's own pre-tokenizer (individual digits, then
GPT-2's byte level), so llama.cpp's converter, which names BPE pre-tokenizers by a hash of what a
tokenizer makes of a fixed text, recognises it as ``smollm``.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["CAPITAL_CHAT_IDS", "VOCAB_SIZE", "save_hf_tokenizer"]

#: The size of SmolLM2's vocabulary (a checkpoint saved with its tokenizer has this vocab_size).
VOCAB_SIZE = 49152

#: The chat ``[{"role": "user", "content": "What is the capital of France?"}]`` rendered with the
#: GGUF's chat template (default system prompt, generation prompt added) and tokenized.
CAPITAL_CHAT_IDS: tuple[int, ...] = (
    1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407,
    19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531,
    198,
)  # fmt: skip


def save_hf_tokenizer(gguf: Path, dest: Path) -> Path:
    """SmolLM2's tokenizer read from the embedded GGUF ``gguf`` and saved as HF files in ``dest``
    (``tokenizer.json``, ``tokenizer_config.json``); returns ``dest``."""
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(dest))
    path = dest / "tokenizer.json"
    spec = json.loads(path.read_text())
    # transformers' GGUF reader gives GPT-2's byte level alone; SmolLM's tokenizer.json splits
    # digits first (llama.cpp's "smollm" pre-tokenizer does the same)
    spec["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, spec["pre_tokenizer"]],
    }
    path.write_text(json.dumps(spec, ensure_ascii=False))
    return dest
