"""``StructuredProcessor``: the logit processor that masks constrained rows with llguidance.

Owner: built once per engine by the ``structured-output`` ``LogitProcessorSpec`` factory, bound to
the engine's tokenizer by ``metrale_engine_started`` (:meth:`StructuredProcessor.bind`: cheap; the
llguidance tokenizer index is built by the first :meth:`validate_params`).  The server calls
:meth:`validate_params` at admission, off the event loop (compiles, caches, or refuses with a
``StructuredOutputError`` naming the field); the engine thread calls ``__call__`` per step.

Per sequence, ``seq.extras["structured"]`` holds a :class:`RowState`: the llguidance matcher, the
number of committed output tokens it has consumed, and the reasoning phase (``start``: the model
may open ``<think>``; ``thinking``: unconstrained until ``</think>``; ``grammar``).

Invariants:
- The matcher consumes each committed output token exactly once: before masking it is synced to
  ``seq.output_ids`` from its own count, so a re-run prefill (preemption, recompute) or a verify
  step never advances it twice.  Draft tokens never advance it: a verify row's drafts are masked
  through llguidance's draft-token batch fill (which rolls back) or a ``deep_copy``.
- One bitmask row per masked logits row, all filled by one ``LLExecutor`` call per step; ids at
  or past the tokenizer's vocabulary (model padding) are always masked; EOS is allowed exactly
  when the matcher accepts (llguidance's mask with the engine's EOS ids).
- Rows without a constraint are never seen (``wants_row``), so their logits are not copied.
- Verify rows past a grammar-invalid draft are left unmasked: that draft is rejected at the
  masked row before it, so they are never sampled.
- A matcher that fails mid-generation (a resource limit) allows only EOS: the row ends, no batch
  fails.
- Overlap: ``prepare`` (before the forward pass) builds the plain rows' masks on one worker
  thread; every other entry point (``__call__``, ``valid_draft_prefix``, the next ``prepare``)
  joins it first, so matchers are touched by one thread at a time.  ``__call__`` uses the
  prepared mask only when its rows, their output lengths and kinds are those it was built for,
  else it builds the mask itself: the result is the same either way.
- Speculative drafts are trimmed to their grammar-valid prefix (``valid_draft_prefix``) before
  verify, so no verify row is spent on a draft the grammar rejects.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from attrs import define
from loguru import logger

from metrale_core.api import StructuredOutputError
from metrale_structured.grammars import GrammarError
from metrale_structured.stats import STATS

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    import llguidance

    from metrale_structured.compiler import Compiler

__all__ = ["EXTRA", "RowState", "StructuredProcessor", "make_processor"]

#: ``seq.extras`` key of the per-sequence state.
EXTRA = "structured"


@define
class RowState:
    """One constrained sequence's matcher and phase."""

    matcher: Any
    phase: str = "grammar"
    consumed: int = 0
    failed: bool = False

    def advance(self, tokens, marks: tuple[int | None, int | None]) -> bool:
        """Consume ``tokens`` (phase-aware); False (and ``failed``) when the grammar rejects one."""
        start, end = marks
        for t in tokens:
            if self.phase == "start":
                if start is not None and t == start:
                    self.phase = "thinking"
                    continue
                self.phase = "grammar"
            if self.phase == "thinking":
                if t == end:
                    self.phase = "grammar"
                continue
            if self.failed or not self.matcher.consume_token(int(t)):
                self.failed = True
                return False
        return True

    def copy(self) -> RowState:
        return RowState(self.matcher.deep_copy(), self.phase, self.consumed, self.failed)


class StructuredProcessor:
    """Masks every row whose request carries ``SamplingParams.structured``."""

    handles_structured_output = True

    def __init__(self, config: Any = None, num_threads: int = 2) -> None:
        #: Set by :meth:`bind` (None: unbound, or the tokenizer has no tokenizer.json form).
        self._tokenizer: Any = None
        self._compiler: Compiler | None = None
        self._compiler_lock = threading.Lock()
        self.num_threads = num_threads
        self._executor: llguidance.LLExecutor | None = None
        self._eos: tuple[int, ...] = ()
        self._marks: dict[tuple[str | None, str | None], tuple[int | None, int | None]] = {}
        self._bitmask = np.zeros((0, 0), dtype=np.int32)
        self._model_vocab = 0
        #: Fill masks during the forward pass (``prepare``); off = every fill in ``__call__``.
        self.overlap = True
        self._pool: ThreadPoolExecutor | None = None  # the one worker thread of prepare(), made on first use
        self._pending: tuple[tuple, Any] | None = None

    # --- set-up ----------------------------------------------------------------------------------
    def bind(self, tokenizer: Any, vocab_size: int, eos_ids) -> None:
        """Remember the engine's tokenizer; its llguidance index is built on first use (:attr:`compiler`)."""
        backend = getattr(tokenizer, "backend", None)
        if backend is None or not hasattr(backend, "to_str"):
            logger.warning(
                "structured output: the tokenizer has no tokenizer.json form; constrained requests will be refused"
            )
            return
        self._eos = tuple(sorted(int(e) for e in eos_ids))
        self._model_vocab = int(vocab_size)
        self._tokenizer = tokenizer

    @property
    def compiler(self) -> Compiler | None:
        """The llguidance compiler of the bound tokenizer, built by the first caller (None: unbound,
        or the tokenizer has no tokenizer.json form).  Building it takes about a second and 100 MB
        for a 150k vocabulary, so an engine that never sees a constrained request never pays it;
        the server asks for it off the event loop (``validate_params`` at admission), so served
        constrained rows reach the engine thread with it built."""
        if self._compiler is None and self._tokenizer is not None:
            with self._compiler_lock:
                if self._compiler is None:
                    self._compiler = self._build_compiler(self._tokenizer)
        return self._compiler

    def _build_compiler(self, tokenizer: Any) -> Compiler:
        import llguidance

        from metrale_structured.compiler import Compiler

        n_vocab = max(self._model_vocab, int(tokenizer.vocab_size))
        compiler = Compiler(tokenizer.backend.to_str(), n_vocab, self._eos, int(tokenizer.vocab_size))
        self._executor = llguidance.LLExecutor(self.num_threads)
        return compiler

    def wants_row(self, row: Any) -> bool:
        return row.params.structured is not None

    def validate_params(self, params: Any) -> None:
        """Compile (or fetch from the cache) the request's constraint; 400-worthy errors raise
        ``StructuredOutputError`` naming the field."""
        spec = params.structured
        if spec is None:
            return
        compiler = self.compiler
        if compiler is None:
            raise StructuredOutputError(
                f"{spec.field}: constrained decoding needs the model's "
                "tokenizer (tokenizer.json), and this engine has none",
                param=spec.field,
            )
        try:
            compiler.matcher(spec.kind, spec.value, spec.field)
        except GrammarError as exc:
            raise StructuredOutputError(str(exc), param=spec.field) from None

    # --- per step --------------------------------------------------------------------------------
    def _bound(self) -> Compiler:
        """The compiler of a bound processor (constrained rows exist only then: validate_params)."""
        compiler = self.compiler
        assert compiler is not None, "a constrained row reached an unbound structured processor"
        return compiler

    def _marks_of(self, spec: Any) -> tuple[int | None, int | None]:
        key = (spec.reasoning_start, spec.reasoning_end)
        marks = self._marks.get(key)
        if marks is None:
            start = self._bound().single_token(spec.reasoning_start) if spec.reasoning_start else None
            end = self._bound().single_token(spec.reasoning_end) if spec.reasoning_end else None
            marks = self._marks[key] = (start, end) if end is not None else (None, None)
        return marks

    def _state(self, seq: Any) -> RowState:
        state = seq.extras.get(EXTRA)
        if state is None:
            spec = seq.params.structured
            matcher = self._bound().matcher(spec.kind, spec.value, spec.field)
            start, end = self._marks_of(spec)
            phase = "grammar"
            if end is not None:
                phase = "thinking" if spec.starts_in_reasoning else ("start" if start is not None else "grammar")
            state = seq.extras[EXTRA] = RowState(matcher, phase)
            STATS.requests += 1
        committed = seq.output_ids
        if state.consumed < len(committed):
            if not state.advance(committed[state.consumed :], self._marks_of(seq.params.structured)):
                _warn_failed(seq, state)
            state.consumed = len(committed)
        return state

    def valid_draft_prefix(self, seq: Any, token_ids: tuple[int, ...]) -> int:
        """How many leading speculative drafts of ``seq`` its grammar accepts (llguidance's
        ``validate_tokens``; the matcher is not advanced).  The speculation driver trims the
        draft to this prefix before verify: the rest would be rejected at a masked row."""
        if self.compiler is None:
            return 0
        self._settle()
        state = self._state(seq)
        if state.failed:
            return 0
        if state.phase == "grammar":
            return int(state.matcher.validate_tokens(list(token_ids)))
        view, marks = state.copy(), self._marks_of(seq.params.structured)
        for i, token in enumerate(token_ids):  # reasoning phases: token by token on a copy
            if not view.advance((token,), marks):
                return i
        return len(token_ids)

    # --- overlap with the forward pass ----------------------------------------------------------
    def prepare(self, ctx: Any) -> None:
        """Before the forward pass: fill the masks of ``ctx``'s rows on the worker thread (plain
        rows only; ``__call__`` joins it, and uses it only for the same rows at the same
        lengths)."""
        self._settle()
        if not self.overlap or self._compiler is None or any(getattr(r, "seq", r) is not r for r in ctx.rows):
            return
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(1, thread_name_prefix="structured-mask")
        key = _key(ctx)
        self._pending = (key, self._pool.submit(self._build, list(ctx.rows), self._model_vocab))

    def _settle(self) -> Any:
        """Join the worker's fill, if any: ``(key, (mask, index))`` or None; never raises."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        key, future = pending
        try:
            return key, future.result()
        except Exception as exc:  # __call__ redoes the fill, and raises on the engine thread
            logger.debug("structured output: the prepared mask failed ({!r}); recomputing", exc)
            return None

    # --- per step --------------------------------------------------------------------------------
    def __call__(self, logits: torch.Tensor, ctx: Any) -> None:
        if self.compiler is None:
            raise StructuredOutputError("structured output: the processor has no tokenizer")
        prepared = self._settle()
        started = time.perf_counter()
        if (
            prepared is not None
            and prepared[0] == _key(ctx)
            and (prepared[1] is None or prepared[1][0].shape[1] == logits.shape[1])
        ):
            built = prepared[1]
            STATS.prepared_steps += 1
        else:
            built = self._build(ctx.rows, logits.shape[1])
        if built is not None:
            _apply(logits, *built)
        STATS.record_mask(time.perf_counter() - started)
        return None

    def _build(self, rows, vocab: int):
        """The ``[rows masked, vocab]`` bool mask (True = banned) and the logits row of each mask
        row, or None when no row is masked (reasoning)."""
        started = time.perf_counter()
        groups: dict[int, list[tuple[int, Any, tuple[int, ...]]]] = {}
        for j, row in enumerate(rows):
            seq = getattr(row, "seq", row)
            pending = tuple(row.output_ids[len(seq.output_ids) :]) if row is not seq else ()
            groups.setdefault(id(seq), []).append((j, seq, pending))
        entries: list[tuple[Any, int, list[int]]] = []
        target: list[tuple[int, int]] = []  # (logits row, mask row)
        extra_allow: list[tuple[int, int]] = []  # (mask row, token id)
        forced_eos: list[int] = []  # mask rows that may only end
        next_row = 0
        for members in groups.values():
            seq = members[0][1]
            state = self._state(seq)
            longest = max(members, key=lambda m: len(m[2]))[2]
            if state.failed:
                for j, _, _ in members:
                    target.append((j, next_row))
                    forced_eos.append(next_row)
                    next_row += 1
                continue
            if state.phase == "grammar":  # fast path: one draft-token batch entry per sequence
                n = state.matcher.validate_tokens(list(longest)) if longest else 0
                entries.append((state.matcher, next_row, list(longest[:n])))
                for j, _, pending in members:
                    if len(pending) <= n:
                        target.append((j, next_row + len(pending)))
                next_row += n + 1
                continue
            marks = self._marks_of(seq.params.structured)
            for j, _, pending in members:  # reasoning phases: per row, on a copy
                view = state.copy() if pending else state
                if pending and not view.advance(pending, marks):
                    continue
                if view.phase == "thinking":
                    continue
                entries.append((view.matcher, next_row, []))
                if view.phase == "start":
                    start_mark = marks[0]
                    assert start_mark is not None  # the "start" phase exists only with a start mark
                    extra_allow.append((next_row, start_mark))
                target.append((j, next_row))
                next_row += 1
        if not target:
            return None
        built = self._mask(vocab, entries, target, extra_allow, forced_eos, next_row)
        STATS.fill_seconds += time.perf_counter() - started
        return built

    def _mask(self, vocab: int, entries, target, extra_allow, forced_eos, num_rows: int):
        import llguidance.numpy as llnp

        compiler, executor = self._bound(), self._executor
        assert executor is not None  # made with the compiler
        words = (max(vocab, compiler.n_vocab) + 31) // 32
        if self._bitmask.shape[0] < num_rows or self._bitmask.shape[1] != words:
            self._bitmask = np.zeros((max(num_rows, 2 * self._bitmask.shape[0]), words), dtype=np.int32)
        bitmask = self._bitmask[:num_rows]
        bitmask.fill(0)
        plain = [(m, r) for m, r, drafts in entries if not drafts]
        drafted = [e for e in entries if e[2]]
        if plain:  # one parallel fill for the batch (a second one for rows with drafts)
            llnp.fill_next_token_bitmask_par(executor, plain, bitmask)
        if drafted:
            llnp.fill_next_token_bitmask_par_with_draft_tokens(executor, drafted, bitmask)
        # disallowed = the inverted bits, unpacked once (uint8 0/1, viewed as bool: no copy)
        banned = np.unpackbits(np.invert(bitmask).view(np.uint8), axis=1, bitorder="little")[:, :vocab]
        banned[:, compiler.tokenizer_vocab :] = 1  # model padding past the tokenizer
        for r, token in extra_allow:
            banned[r, token] = 0
        for r in forced_eos:
            banned[r, list(self._eos)] = 0
        rows = [r for _, r in target]
        picked = banned if rows == list(range(num_rows)) else banned[rows]
        empty = picked.all(axis=1)
        if empty.any():  # a matcher that stopped without allowing EOS: end the row
            STATS.matcher_errors += int(empty.sum())
            picked[np.nonzero(empty)[0][:, None], list(self._eos)] = 0
        return torch.from_numpy(picked.view(np.bool_)), [j for j, _ in target]


def _key(ctx: Any) -> tuple:
    """What a prepared mask was built for: each row's sequence and output length, and kind."""
    return tuple((id(getattr(r, "seq", r)), len(r.output_ids)) for r in ctx.rows), tuple(ctx.kinds)


def _apply(logits: torch.Tensor, mask: torch.Tensor, index: list[int]) -> None:
    """Ban ``mask``'s tokens in the logits rows ``index`` (one per mask row), in place."""
    if mask.device != logits.device:
        mask = mask.to(logits.device)
    if len(index) == logits.shape[0] and index == list(range(len(index))):
        logits.masked_fill_(mask, float("-inf"))
    else:
        idx = torch.tensor(index, dtype=torch.long, device=logits.device)
        logits[idx] = logits[idx].masked_fill(mask, float("-inf"))


def _warn_failed(seq: Any, state: RowState) -> None:
    STATS.matcher_errors += 1
    logger.warning(
        "structured output: request {!r}: the grammar rejected a committed token ({}); the sequence is ended",
        seq.request_id,
        state.matcher.get_error(),
    )


def make_processor(config: Any = None) -> StructuredProcessor:
    """``LogitProcessorSpec.factory``: one processor per engine (bound at engine start)."""
    return StructuredProcessor(config)
