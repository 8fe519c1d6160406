"""Random benchmark prompts of a given length in tokens, cut with the server's own tokenizer.

Owner: :mod:`metrale_core.bench.serve`.  Each prompt is random words from a seeded generator (no
two prompts share a prefix, so no prefix cache helps).  Where the server has ``POST /tokenize``
(``met serve`` / vLLM take ``{"prompt"}``, llama-server ``{"content"}``; both answer
``{"tokens": [...]}``) the words are tokenized there and cut to exactly the asked length: sent as
token ids to ``/v1/completions``, or turned back into text (``/detokenize``) for the chat endpoint,
whose template then adds its own tokens.  Without ``/tokenize`` the length is approximate
(:data:`TOKENS_PER_WORD`).

Invariants:
- Same ``seed`` -> same words; ``exact`` is True only when every prompt was cut from the server's
  tokenization.
- The tokenizer requests are made before any timed request.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

__all__ = ["TOKENS_PER_WORD", "Prompt", "PromptSet", "make_prompts", "random_words"]

#: The guess for a BPE tokenizer's tokens per common English word (with its leading space).
TOKENS_PER_WORD = 1.3
_WORD_TEXT = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government number "
    "night point home water room mother area money story fact month lot right study book eye job word "
    "business issue side kind head house service friend father power hour game line end member law car "
    "city community name president team minute idea kid body information back parent face others level "
    "office door health person art war history party result change morning reason research girl guy "
    "moment air teacher force education river light stone green quick bright small happy old new long"
)
_WORDS = _WORD_TEXT.split()


def random_words(rng: random.Random, count: int) -> str:
    """``count`` random words joined by spaces."""
    return " ".join(rng.choice(_WORDS) for _ in range(count))


@dataclass
class Prompt:
    """One prompt: token ids (exact, completions), or text; ``tokens`` is its length (known or
    estimated)."""

    text: str
    ids: list[int] | None
    tokens: int


@dataclass
class PromptSet:
    prompts: list[Prompt]
    #: Whether the lengths are exact (cut with the server's /tokenize).
    exact: bool
    how: str


async def _tokenize(http: Any, base: str, text: str) -> list[int] | None:
    """The server's tokens of ``text`` (met/vLLM shape, then llama.cpp's); None without /tokenize."""
    for body in ({"prompt": text, "add_special_tokens": False}, {"content": text}):
        r = await http.post(base + "/tokenize", json=body)
        if r.status_code == 200:
            tokens = r.json().get("tokens")
            if tokens and all(isinstance(t, int) for t in tokens):
                return tokens
    return None


async def _detokenize(http: Any, base: str, ids: list[int]) -> str | None:
    r = await http.post(base + "/detokenize", json={"tokens": ids})
    if r.status_code != 200:
        return None
    body = r.json()
    text = body.get("prompt", body.get("content"))
    return text if isinstance(text, str) else None


async def _exact(http: Any, base: str, rng: random.Random, tokens: int, as_ids: bool) -> Prompt | None:
    words = tokens
    for _ in range(6):  # grow the text until it has enough tokens
        text = random_words(rng, words)
        ids = await _tokenize(http, base, text)
        if ids is None:
            return None
        if len(ids) >= tokens:
            ids = ids[:tokens]
            if as_ids:
                return Prompt(text, ids, tokens)
            cut = await _detokenize(http, base, ids)
            return None if cut is None else Prompt(cut, None, tokens)
        words *= 2
    return None


async def make_prompts(http: Any, base: str, count: int, tokens: int, seed: int, as_ids: bool) -> PromptSet:
    """``count`` prompts of ``tokens`` tokens each (``as_ids``: token ids where exact)."""
    rng = random.Random(seed)
    prompts: list[Prompt] = []
    for _ in range(count):
        prompt = await _exact(http, base, rng, tokens, as_ids)
        if prompt is None:
            break
        prompts.append(prompt)
    if len(prompts) == count:
        how = "exact: server /tokenize" + (", sent as token ids" if as_ids else "; the chat template adds its own")
        return PromptSet(prompts, True, how)
    rng = random.Random(seed)
    words = max(1, round(tokens / TOKENS_PER_WORD))
    approx = [Prompt(random_words(rng, words), None, tokens) for _ in range(count)]
    return PromptSet(approx, False, f"approximate: no server /tokenize, {words} words ~ {tokens} tokens")
