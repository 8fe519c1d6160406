"""Known token ids of the embedded SmolLM2-135M-Instruct GGUF, shared by the tests that pin them.

Owner: tests only.  Invariants: the ids are what the GGUF's own tokenizer and chat template give
(``tests/tokenizer/test_chat_template.py`` checks them against transformers' template), so a test
that feeds them to the model feeds exactly what ``met serve`` would.
"""

from __future__ import annotations

__all__ = ["CAPITAL_CHAT_IDS"]

#: The chat ``[{"role": "user", "content": "What is the capital of France?"}]`` rendered with the
#: GGUF's chat template (default system prompt, generation prompt added) and tokenized.
CAPITAL_CHAT_IDS: tuple[int, ...] = (
    1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407,
    19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531,
    198,
)  # fmt: skip
