"""``met bench engine``: prefill and decode speed of the engine in this process, like ``llama-bench``.

Owner: ``metrale_core.cli.bench_cmd`` (which loads the model and builds the ``LLMEngine`` from the
same engine flags as ``met serve``).  Tests, each repeated ``reps`` times after one untimed
warm-up of every test:

- ``ppP``: one prompt of ``P`` tokens, max_tokens 1; ``P / (first token - start)``.
- ``tgN`` / ``tgN@bB``: ``B`` sequences (1 without ``@b``) each generate ``N`` tokens greedily
  after a short prompt, ``ignore_eos``; the aggregate rate of the tokens after every sequence's
  first, over the time from the step that gave the last of the first tokens to the end.

Invariants:
- Every timed prompt is new (random words seeded by the run), so the prefix cache never serves a
  timed prefill; the engine is stepped directly (no thread, no server).
- A test that cannot run (prompt longer than the model's context) is a one-line error before any
  timing.
"""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import dataclass
from typing import Any

from metrale_core.bench.prompts import random_words
from metrale_core.bench.stats import mean_sd
from metrale_core.errors import InvalidRequest

__all__ = ["DECODE_PROMPT_TOKENS", "EngineBench"]

#: The prompt each decode sequence starts from.
DECODE_PROMPT_TOKENS = 16


@dataclass
class _Test:
    name: str
    kind: str  # "pp" or "tg"
    tokens: int
    batch: int


class EngineBench:
    """Runs the pp/tg tests on ``engine`` (an ``LLMEngine``) with prompts from ``tokenizer``."""

    def __init__(self, engine: Any, tokenizer: Any, seed: int = 0) -> None:
        self.engine, self.tokenizer = engine, tokenizer
        self._rng = random.Random(seed)
        self._ids = itertools.count()

    def prompt(self, tokens: int) -> list[int]:
        """A fresh prompt of exactly ``tokens`` ids (random words, tokenized here)."""
        words = max(4, tokens)
        while True:
            ids = self.tokenizer.encode(random_words(self._rng, words), add_special_tokens=False)
            if len(ids) >= tokens:
                return list(ids[:tokens])
            words *= 2

    def _add(self, prompt: list[int], max_tokens: int) -> str:
        from metrale_core.sampling.params import SamplingParams

        request_id = f"bench-{next(self._ids)}"
        self.engine.add_request(
            request_id, prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        )
        return request_id

    def _step(self) -> list[Any]:
        outputs = self.engine.step()
        for out in outputs:
            if out.finished and out.finish_reason == "error":
                raise InvalidRequest(out.error or "generation failed")
        return outputs

    def prefill(self, tokens: int) -> float:
        """Prompt tokens per second of one ``tokens``-long prefill."""
        self._add(self.prompt(tokens), 1)
        start = time.perf_counter()
        first = float("nan")
        while self.engine.has_unfinished():
            got = sum(len(o.new_token_ids) for o in self._step())
            if got and first != first:
                first = time.perf_counter()
        return tokens / (first - start)

    def decode(self, tokens: int, batch: int) -> float:
        """Aggregate generated tokens per second of ``batch`` sequences of ``tokens`` tokens."""
        waiting = {self._add(self.prompt(DECODE_PROMPT_TOKENS), tokens) for _ in range(batch)}
        produced, start = 0, float("nan")
        while self.engine.has_unfinished():
            for out in self._step():
                if out.new_token_ids:
                    produced += len(out.new_token_ids)
                    waiting.discard(out.request_id)
            if not waiting and start != start:
                start, produced = time.perf_counter(), 0  # every sequence has its first token
        end = time.perf_counter()
        if tokens < 2:
            return float("nan")
        return produced / (end - start)

    def run(self, prompt_tokens: int, gen_tokens: int, batches: list[int], reps: int) -> list[dict[str, Any]]:
        """Every test ``reps`` times after one warm-up; ``[{test, tokens_per_s, tokens_per_s_sd, runs}]``."""
        tests: list[_Test] = []
        if prompt_tokens > 0:
            tests.append(_Test(f"pp{prompt_tokens}", "pp", prompt_tokens, 1))
        if gen_tokens > 0:
            for b in batches:
                tests.append(_Test(f"tg{gen_tokens}" + (f"@b{b}" if b > 1 else ""), "tg", gen_tokens, b))
        self._check(tests)
        results = []
        for test in tests:
            self._once(test, warm=True)
            runs = [self._once(test) for _ in range(reps)]
            mean, sd = mean_sd(runs)
            results.append({"test": test.name, "tokens_per_s": mean, "tokens_per_s_sd": sd, "runs": runs})
        return results

    def _once(self, test: _Test, warm: bool = False) -> float:
        if test.kind == "pp":
            return self.prefill(min(test.tokens, 16) if warm else test.tokens)
        return self.decode(min(test.tokens, 4) if warm else test.tokens, test.batch)

    def _check(self, tests: list[_Test]) -> None:
        limit = self.engine.max_model_len
        for test in tests:
            need = test.tokens + (1 if test.kind == "pp" else DECODE_PROMPT_TOKENS)
            if need > limit:
                raise InvalidRequest(f"{test.name} needs {need} tokens but the model's context is {limit}")
            if test.batch > self.engine.config.max_num_seqs:
                raise InvalidRequest(
                    f"{test.name}: batch {test.batch} is over --max-num-seqs {self.engine.config.max_num_seqs}"
                )
