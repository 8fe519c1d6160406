"""llguidance tokenizers (one per model) and compiled grammars (cached, memory-bounded).

Owner: the structured-output processor (:mod:`metrale_structured.processor`) binds one
:class:`Compiler` per engine (``metrale_engine_started``) and asks it for a fresh matcher per
request.  The server thread compiles at admission (``validate_params``), the engine thread reuses
the cached result, so the cache is guarded by a lock.

Invariants:
- An ``LLTokenizer`` is built once per (tokenizer.json text, model vocab, EOS ids) in this process,
  whatever number of engines or requests use it.
- Compiled grammars are cached by (tokenizer, kind, grammar text) in an LRU bounded both in
  entries (:data:`MAX_ENTRIES`) and in grammar text bytes (:data:`MAX_BYTES`); a hit hands out a
  ``deep_copy`` of the compiled matcher, never the cached one.
- A grammar is accepted only when it validates, builds, and computes its first mask within the
  parser limits (:data:`LIMITS`): a pathological pattern is a :class:`GrammarError`, not a hang.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from typing import Any

import numpy as np

from metrale_structured.grammars import GrammarError, grammar_text
from metrale_structured.stats import STATS

__all__ = ["LIMITS_KW", "MAX_BYTES", "MAX_ENTRIES", "Compiler", "llg_tokenizer"]

MAX_ENTRIES = 512
MAX_BYTES = 64 << 20
#: Parser limits: tighter lexer-state and initial-fuel budgets than llguidance's defaults bound compile
#: time and memory of hostile regexes; ordinary schemas use a few hundred states.
LIMITS_KW: dict[str, Any] = dict(max_lexer_states=50_000, initial_lexer_fuel=200_000, step_lexer_fuel=200_000)

_TOKENIZERS: dict[tuple, Any] = {}
_TOKENIZERS_LOCK = threading.Lock()


def llg_tokenizer(tokenizer_json: str, n_vocab: int, eos_ids: tuple[int, ...]) -> tuple[Any, str]:
    """The process-wide ``LLTokenizer`` of a tokenizer.json text, and its cache key."""
    import llguidance

    digest = hashlib.sha256(tokenizer_json.encode()).hexdigest()[:24]
    key = (digest, n_vocab, eos_ids)
    with _TOKENIZERS_LOCK:
        tok = _TOKENIZERS.get(key)
        if tok is None:
            started = time.perf_counter()
            tok = llguidance.LLTokenizer(tokenizer_json, n_vocab=n_vocab, eos_token=list(eos_ids) if eos_ids else None)
            STATS.tokenizer_setup_s += time.perf_counter() - started
            _TOKENIZERS[key] = tok
    return tok, f"{digest}:{n_vocab}:{','.join(map(str, eos_ids))}"


class Compiler:
    """Compiles constraints for one tokenizer; hands out fresh matchers."""

    def __init__(self, tokenizer_json: str, n_vocab: int, eos_ids: tuple[int, ...], tokenizer_vocab: int) -> None:
        import llguidance
        import llguidance.numpy

        self._llg = llguidance
        self.tok, self.key = llg_tokenizer(tokenizer_json, n_vocab, tuple(eos_ids))
        self.n_vocab = n_vocab
        #: Ids at or past this are padding rows of the model's vocabulary: always masked.
        self.tokenizer_vocab = min(tokenizer_vocab, n_vocab)
        self.limits = llguidance.LLParserLimits(**LIMITS_KW)
        self._cache: OrderedDict[tuple, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    # --- tokens --------------------------------------------------------------------------------
    def single_special(self, text: str) -> int | None:
        """The id of ``text`` when it is exactly one special token of this tokenizer, else None."""
        ids = self.tok.tokenize_str(text)
        if len(ids) == 1 and self.tok.is_special_token(ids[0]):
            return ids[0]
        return None

    def single_token(self, text: str) -> int | None:
        ids = self.tok.tokenize_str(text)
        return ids[0] if len(ids) == 1 else None

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode_str(ids)

    # --- grammars ------------------------------------------------------------------------------
    def matcher(self, kind: str, value: str, field: str) -> Any:
        """A fresh matcher of the constraint (compiled once, cached); raises ``GrammarError``."""
        key = (kind, value)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                STATS.cache_hits += 1
                return hit[0].deep_copy()
        template, size = self._compile(kind, value, field)
        with self._lock:
            if key not in self._cache:
                self._cache[key] = (template, size)
                self._bytes += size
                while self._cache and (len(self._cache) > MAX_ENTRIES or self._bytes > MAX_BYTES):
                    _, (_, old) = self._cache.popitem(last=False)
                    self._bytes -= old
        return template.deep_copy()

    def _compile(self, kind: str, value: str, field: str) -> tuple[Any, int]:
        started = time.perf_counter()
        text = grammar_text(kind, value, field, special=self.single_special)
        llg = self._llg
        error = llg.LLMatcher.validate_grammar(text, self.tok, limits=self.limits)
        if error:
            raise GrammarError(f"{field}: {_reason(kind)}: {error.strip()}")
        template = llg.LLMatcher(self.tok, text, log_level=0, limits=self.limits)
        if not template.is_error():  # the first mask builds the lexer's initial states
            probe = np.zeros((1, (self.n_vocab + 31) // 32), dtype=np.int32)
            llg.numpy.fill_next_token_bitmask(template, probe, 0)
        if template.is_error():
            raise GrammarError(f"{field}: {_reason(kind)}: {template.get_error().strip()}")
        elapsed = time.perf_counter() - started
        STATS.record_compile(elapsed)
        return template, len(text) + len(value)

    def cache_info(self) -> dict[str, int]:
        with self._lock:
            return {"entries": len(self._cache), "bytes": self._bytes}


def _reason(kind: str) -> str:
    return {
        "json_schema": "invalid or unsupported JSON Schema",
        "regex": "invalid regex",
        "choice": "invalid choice list",
        "grammar": "the GBNF grammar does not compile",
        "lark": "the Lark grammar does not compile",
        "tool_calls": "the tool call grammar does not compile",
    }.get(kind, kind)
