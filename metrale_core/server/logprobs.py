"""Engine logprobs -> OpenAI's two logprob shapes (chat ``content`` entries, completions arrays).

Owner: the chat and completions routes.  The engine reports, per generated token,
``(token_id, logprob, ((top_id, top_logprob), ...))``; this module names the tokens.

Invariants:
- A token's ``bytes`` are its exact bytes (byte-level BPE pieces are mapped back through the
  GPT-2 byte alphabet), so a character split across tokens is still recoverable; its ``token``
  text is those bytes decoded with replacement characters.
- ``-inf`` (a token masked by the sampler) is reported as ``-9999.0``, as OpenAI does, because
  JSON has no infinity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

__all__ = ["TokenNamer", "chat_logprobs", "completion_logprobs"]


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    from metrale_core.text.tokenizer import _bytes_to_unicode

    return {ch: b for b, ch in _bytes_to_unicode().items()}


def _finite(value: float) -> float:
    return value if math.isfinite(value) else -9999.0


class TokenNamer:
    """Token id -> (text, bytes), cached per tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            hit = self._cache[token_id] = self._name(token_id)
        return hit

    def _name(self, token_id: int) -> tuple[str, list[int]]:
        piece = self.tokenizer.id_to_token(token_id)
        if piece is None:
            return "", []
        decoder = _byte_decoder()
        special = token_id in self.tokenizer.special_token_ids
        if not special and piece and all(ch in decoder for ch in piece):
            raw = bytes(decoder[ch] for ch in piece)
        else:
            raw = self.tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")
        return raw.decode("utf-8", errors="replace"), list(raw)


def chat_logprobs(namer: TokenNamer, entries: Sequence[tuple]) -> list[dict]:
    """``choices[].logprobs.content`` entries for the engine's per-token logprobs."""
    out = []
    for token_id, logprob, top in entries:
        text, raw = namer(token_id)
        tops = []
        for tid, lp in top:
            t_text, t_raw = namer(tid)
            tops.append({"token": t_text, "logprob": _finite(lp), "bytes": t_raw})
        out.append({"token": text, "logprob": _finite(logprob), "bytes": raw, "top_logprobs": tops})
    return out


def completion_logprobs(namer: TokenNamer, entries: Sequence[tuple], text_offset: int) -> dict:
    """The legacy completions ``logprobs`` object; offsets count characters from ``text_offset``."""
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    offset = text_offset
    for token_id, logprob, top in entries:
        text, _ = namer(token_id)
        tokens.append(text)
        token_logprobs.append(_finite(logprob))
        top_logprobs.append({namer(tid)[0]: _finite(lp) for tid, lp in top})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": offsets}
