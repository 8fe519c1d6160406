"""``RecordingModel``: the recording fake model that drives the real scheduler in trace tests.

It implements :class:`metrale_core.model_api.CausalLM` without any maths.  Every forward is
recorded as one readable line with its scheduling arguments (per sequence: key, start position,
number of rows, state_fresh, and the token each requested logits row answers), and logits come
from a per-request :class:`SeqScript`.

How it answers.  A sequence is identified by its first prompt token (its *key*; seed 004's
``recurrent_key`` with no session hash).  The key is read from the row at position 0 when this
forward feeds it, otherwise back from the paged KV cache through ``block_tables`` — the way a
real model reads its past.  The logits row of a row at position ``p`` is one-hot
(:data:`LOGIT_HIGH`) on the script's token at position ``p + 1``: a prompt token inside the
prompt, ``output[p + 1 - prompt_len]`` after it, and ``past_end`` (EOS by default) past the end.

What it checks, as a real model must.
- KV readback: each row writes its token id into K and its position into V at ``slot_mapping``;
  then every cached position ``0 .. context_len - 1`` of the sequence is read back through
  ``block_tables`` and compared with the script (prompt + output).  A mismatch (a wrong block
  table, a wrong slot, a wrong fed token) is recorded as an error line and the sequence's
  outputs in this forward are :data:`GARBAGE`.
- Layout: the rows of sequence ``i`` must sit at ``context_len - n .. context_len - 1``.
- Recurrent mode (``recurrent_fed_rows=True``, seed 004, see ``recurrent_state``): state keyed by
  the key; consuming from anywhere but the expected position corrupts it for good and every
  later output of that sequence is GARBAGE.  ``state_fresh`` must be set exactly at position 0,
  and a continuing sequence must use the state slot its state was started in.
- Speculative verify (``batch.verify_host``): the rows of a verify chunk after its first are
  drafts, so the readback checks them against what was fed, not the script; every row answers
  from the script.  In recurrent mode the chunk advances the state past its rows until the engine
  calls :meth:`RecordingModel.commit_verify`, which rolls it back to the kept rows (a line
  ``commit_verify s<key> keep <n>/<rows>``); an engine that forgets shows "consumed again".
- Windowed mode (``window=w``): the model has two attention layers, layer 0 global and layer 1
  attending to the last ``w`` positions (``KVLayout.windows``), so the engine keeps two KV groups
  over one pool (the two layers share the pool tensor: each writes only its group's pages).
  Each row is written into both layers through each group's slots; the readback checks layer 0
  at every cached position and layer 1 at the positions the chunk's first row can see
  (``first - w + 1 ..``), read through group 1's tables (``batch.for_group(1)``), so a block
  freed too early, reused by another sequence or another group, shows as an error.  After each
  forward one line per sequence pins the block tables: ``blocks s<key> full=[...] window=[...]``
  (``-`` for the window entries before the visible ones, never read).
- Injected faults: a forward whose call index is in ``fail_kv_at_steps`` raises
  :class:`~metrale_core.errors.KVCacheExhausted` before consuming anything (no KV write, no
  state change), the way a device allocation failure surfaces mid-step.  The engine as built
  lets it out of ``LLMEngine.step``; its driver (``AsyncEngine``, or the scenario runner) then
  calls ``LLMEngine.fail_in_flight``: every sequence of that step finishes with "error" and the
  message ``"KVCacheExhausted: ..."``, keeping what it streamed, while waiting requests run on
  (golden ``model_kv_exhausted``).  Since nothing was consumed, an engine could instead re-plan
  the step (preempt and retry); the trace would show that change.

Trace lines: one ``forward #i: s<key>@<start>+<rows>[ fresh][ -> answers]`` per forward, then
the lines that forward caused (``error: ...``, ``recurrent state of ...``).

Owner: tests (``metrale_core.testing``); never imported by the engine.
Invariants: deterministic — the same calls give the same lines; nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
from attrs import define, field, frozen

from metrale_core.errors import KVCacheExhausted
from metrale_core.model_api import ForwardBatch, KVLayout, ModelInfo, PagedKVCache, RecurrentLayout
from metrale_core.testing.recurrent_state import RecurrentTracker

__all__ = ["EOS", "GARBAGE", "LOGIT_HIGH", "ForwardCall", "RecordingModel", "SeqCall", "SeqScript", "StatePool"]

#: The token a sequence answers once its state (KV readback or recurrent) is wrong.
GARBAGE = 1
#: Default end-of-sequence id, answered past the end of a script.
EOS = 2
#: The value of the one-hot logit (every other logit is 0).
LOGIT_HIGH = 100.0


def _ids(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


@frozen
class SeqScript:
    """What one request's sequence holds: its prompt and the tokens the model answers after it."""

    prompt: tuple[int, ...] = field(converter=_ids)
    output: tuple[int, ...] = field(converter=_ids)

    def __attrs_post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("SeqScript needs a non-empty prompt (its first token is the key)")

    @property
    def key(self) -> int:
        return self.prompt[0]

    def token_at(self, position: int, past_end: int) -> int:
        """The token the sequence holds at ``position`` (prompt, then output, then ``past_end``)."""
        if position < len(self.prompt):
            return self.prompt[position]
        index = position - len(self.prompt)
        return self.output[index] if index < len(self.output) else past_end


@frozen
class SeqCall:
    """One sequence's part of a forward, as recorded."""

    key: int
    start: int
    num_rows: int
    fresh: bool
    #: Tokens answered for this sequence's logits rows, in row order (empty: no logits asked).
    answers: tuple[int, ...]

    def render(self) -> str:
        text = f"s{self.key}@{self.start}+{self.num_rows}"
        if self.fresh:
            text += " fresh"
        if self.answers:
            text += " -> " + ",".join("GARBAGE" if t == GARBAGE else str(t) for t in self.answers)
        return text


@frozen
class ForwardCall:
    """One recorded forward."""

    index: int
    seqs: tuple[SeqCall, ...]

    def render(self) -> str:
        return f"forward #{self.index}: " + " | ".join(s.render() for s in self.seqs)


@define
class StatePool:
    """The recurrent-state pool handed to the engine: which key's state each slot holds."""

    owners: list[int | None]


@define(init=False)  # the __init__ below builds the fields and calls __attrs_init__
class RecordingModel:
    """The recording fake model; see the module docstring."""

    scripts: Mapping[int, SeqScript]
    info: ModelInfo
    past_end: int
    fail_kv_at_steps: frozenset[int]
    recurrent_fed_rows: bool
    #: Windowed mode's window (None: one global layer); see the module docstring.
    window: int | None
    #: Every recorded line, in order: forwards, injected faults, errors, recurrent corruption.
    lines: list[str] = field(factory=list)
    #: The structured forwards (same order as their lines).
    calls: list[ForwardCall] = field(factory=list)
    #: Only the error lines (readback, layout, state slot, unknown key).
    errors: list[str] = field(factory=list)
    _num_forwards: int = 0
    _tracker: RecurrentTracker = field(init=False)
    #: Lines noted while a forward runs, written after its own line.
    _pending: list[str] = field(factory=list)
    #: key -> (start, rows) of its verify chunk awaiting ``commit_verify``.
    _verifying: dict[int, tuple[int, int]] = field(factory=dict)

    def __init__(
        self,
        scripts: Mapping[int, SeqScript] | Iterable[SeqScript],
        *,
        vocab_size: int = 64,
        eos_token_id: int = EOS,
        past_end: int | None = None,
        fail_kv_at_steps: Iterable[int] = (),
        recurrent_fed_rows: bool = False,
        max_position: int = 4096,
        window: int | None = None,
    ) -> None:
        items = list(scripts.values()) if isinstance(scripts, Mapping) else list(scripts)
        by_key: dict[int, SeqScript] = {}
        for script in items:
            if by_key.get(script.key) == script:
                continue  # the same request again (a prefix-cache hit): one script
            if script.key in by_key:
                raise ValueError(
                    f"two scripts share the first prompt token {script.key}; "
                    "the recording model keys sequences by it, so make them distinct"
                )
            by_key[script.key] = script
        if isinstance(scripts, Mapping):
            for key, script in scripts.items():
                if key != script.key:
                    raise ValueError(f"script under key {key} starts with {script.key}")
        tokens = [t for s in by_key.values() for t in s.prompt + s.output]
        if any(not 0 <= t < vocab_size for t in tokens):
            raise ValueError(f"script tokens must lie in [0, {vocab_size})")
        info = ModelInfo(
            architecture="recording-fake",
            vocab_size=vocab_size,
            max_position=max_position,
            kv=KVLayout(
                num_layers=1 if window is None else 2,
                num_kv_heads=1,
                head_dim=1,
                dtype=torch.float32,
                windows=() if window is None else (None, window),
            ),
            recurrent=RecurrentLayout(num_layers=1, bytes_per_sequence=64) if recurrent_fed_rows else None,
            eos_token_ids=(eos_token_id,),
        )
        self.__attrs_init__(
            scripts=by_key,
            info=info,
            past_end=eos_token_id if past_end is None else past_end,
            fail_kv_at_steps=frozenset(fail_kv_at_steps),
            recurrent_fed_rows=recurrent_fed_rows,
            window=window,
        )
        self._tracker = RecurrentTracker(enabled=recurrent_fed_rows, record=self._pending.append)

    # -- CausalLM ----------------------------------------------------------------------------

    def make_state_pool(self, num_slots: int) -> StatePool | None:
        return StatePool(owners=[None] * num_slots) if self.recurrent_fed_rows else None

    def forward(self, batch: ForwardBatch, kv: PagedKVCache | None, state: object | None = None) -> torch.Tensor:
        index = self._num_forwards
        self._num_forwards += 1
        if index in self.fail_kv_at_steps:
            self.lines.append(f"forward #{index}: raise KVCacheExhausted (injected)")
            raise KVCacheExhausted(f"KV cache exhausted (injected by RecordingModel at forward #{index})")
        if kv is None:
            raise ValueError("RecordingModel declares a KV layout; forward needs the paged cache")
        ids = [int(t) for t in batch.input_ids.tolist()]
        positions = [int(p) for p in batch.positions.tolist()]
        starts = [int(q) for q in batch.query_start.tolist()]
        tables = batch.block_tables.tolist()
        fresh_flags = [bool(f) for f in batch.state_fresh.tolist()]
        slots = [int(s) for s in batch.state_slots.tolist()]
        wanted = [int(r) for r in batch.logits_rows.tolist()]
        verify = batch.verify_host or (False,) * len(batch.context_lens_host)
        windowed = batch.for_group(1) if self.window is not None else None
        if windowed is None:
            self._write_kv(kv, ids, positions, [int(s) for s in batch.slot_mapping.tolist()])
        else:
            self._write_kv(kv, ids, positions, [int(s) for s in batch.slot_mapping.tolist()], layers=(0,))
            self._write_kv(kv, ids, positions, [int(s) for s in windowed.slot_mapping.tolist()], layers=(1,))
        window_tables = windowed.block_tables.tolist() if windowed is not None else None

        answer_of_row: dict[int, int] = {}
        seqs: list[SeqCall] = []
        pending = self._pending
        for i, ctx in enumerate(batch.context_lens_host):
            lo, hi = starts[i], starts[i + 1]
            start = ctx - (hi - lo)
            key = ids[lo] if start == 0 else self._read(kv, tables[i], 0)[0]
            fed = ids[lo:hi] if verify[i] else ()
            if verify[i]:
                self._verifying[key] = (start, hi - lo)
            clean = self._check_sequence(i, key, lo, hi, ctx, positions, tables[i], kv, pending, fed)
            if window_tables is not None:
                clean = self._check_window(key, start, ctx, window_tables[i], kv, pending, fed) and clean
                pending.append(self._render_tables(key, start, tables[i], window_tables[i], ctx, kv.block_size))
            clean = self._check_state(key, start, fresh_flags[i], slots[i], state, pending) and clean
            clean = self._tracker.consume(key, start, hi - lo) and clean
            rows = [r for r in wanted if lo <= r < hi]
            script = self.scripts.get(key)
            for r in rows:
                answer_of_row[r] = (
                    script.token_at(positions[r] + 1, self.past_end) if clean and script is not None else GARBAGE
                )
            seqs.append(
                SeqCall(
                    key=key,
                    start=start,
                    num_rows=hi - lo,
                    fresh=fresh_flags[i],
                    answers=tuple(answer_of_row[r] for r in rows),
                )
            )
        call = ForwardCall(index=index, seqs=tuple(seqs))
        self.calls.append(call)
        self.lines.append(call.render())
        for line in pending:
            if line.startswith("error:"):
                self.errors.append(line)
            self.lines.append(line)
        pending.clear()
        logits = torch.zeros((len(wanted), self.info.vocab_size), dtype=torch.float32)
        for n, r in enumerate(wanted):
            logits[n, answer_of_row[r]] = LOGIT_HIGH
        return logits

    # -- helpers -----------------------------------------------------------------------------

    def trace(self) -> str:
        """All recorded lines joined, one per line."""
        return "\n".join(self.lines)

    def first_prefill(self) -> dict[int, int]:
        """Sequence key -> index of the forward that ran its first prefill chunk (position 0)."""
        found: dict[int, int] = {}
        for call in self.calls:
            for seq in call.seqs:
                if seq.start == 0 and seq.key not in found:
                    found[seq.key] = call.index
        return found

    @staticmethod
    def _write_kv(
        kv: PagedKVCache,
        ids: list[int],
        positions: list[int],
        slot_mapping: list[int],
        layers: Sequence[int] | None = None,
    ) -> None:
        bs = kv.block_size
        chosen = range(len(kv.k)) if layers is None else layers
        for token, pos, slot in zip(ids, positions, slot_mapping):
            for layer in chosen:
                kv.k[layer][slot // bs, slot % bs] = float(token)
                kv.v[layer][slot // bs, slot % bs] = float(pos)

    @staticmethod
    def _read(kv: PagedKVCache, table: Sequence[int], position: int, layer: int = 0) -> tuple[int, int, int]:
        """``(token, position, block)`` stored for ``position`` of ``layer`` through one block table."""
        bs = kv.block_size
        block = int(table[position // bs]) if position // bs < len(table) else -1
        if not 0 <= block < kv.num_blocks:
            return -1, -1, block
        k, v = kv.k[layer], kv.v[layer]
        return int(k[block, position % bs, 0, 0]), int(v[block, position % bs, 0, 0]), block

    def _check_window(
        self,
        key: int,
        start: int,
        ctx: int,
        table: Sequence[int],
        kv: PagedKVCache,
        pending: list[str],
        fed: Sequence[int] = (),
    ) -> bool:
        """Windowed mode: layer 1 holds what the chunk's first row (at ``start``) can see onward."""
        script = self.scripts.get(key)
        if script is None or self.window is None:
            return False
        window_start = max(0, start - self.window + 1)
        return self._readback(key, script, window_start, ctx, table, kv, pending, fed, layer=1, what="window KV")

    def _readback(
        self,
        key: int,
        script: SeqScript,
        lo: int,
        ctx: int,
        table: Sequence[int],
        kv: PagedKVCache,
        pending: list[str],
        fed: Sequence[int],
        layer: int = 0,
        what: str = "KV",
    ) -> bool:
        """Positions ``lo .. ctx - 1`` of ``layer`` hold the script's tokens (past the verify chunk's
        first row, the ``fed`` rows) at their own positions; else one error line, and False."""
        first_draft = ctx - len(fed) + 1
        for q in range(lo, ctx):
            want = fed[q - first_draft + 1] if fed and q >= first_draft else script.token_at(q, self.past_end)
            token, pos, block = self._read(kv, table, q, layer=layer)
            if (token, pos) != (want, q):
                pending.append(
                    f"error: s{key} {what} readback at position {q} (block {block}) holds "
                    f"token {token}@{pos}, expected {want}@{q}"
                )
                return False
        return True

    def _render_tables(
        self, key: int, start: int, full: Sequence[int], window: Sequence[int], ctx: int, block_size: int
    ) -> str:
        """``blocks s<key> full=[..] window=[..]`` over the blocks holding ``0 .. ctx - 1``."""
        n = -(-ctx // block_size)
        first = max(0, start - (self.window or 0) + 1) // block_size
        shown = ["-" if i < first else str(int(b)) for i, b in enumerate(window[:n])]
        return f"blocks s{key} full=[{' '.join(str(int(b)) for b in full[:n])}] window=[{' '.join(shown)}]"

    def commit_verify(self, state: object | None, slots: Sequence[int], num_kept: Sequence[int]) -> None:
        """The model-contract extension (``metrale_core.model_api``): keep only the first
        ``num_kept[j]`` rows of the verify chunk of the sequence in state slot ``slots[j]``."""
        for slot, kept in zip(slots, num_kept):
            key = state.owners[slot] if isinstance(state, StatePool) else None
            if key not in self._verifying:
                self.lines.append(f"error: commit_verify for slot {slot} without a verify chunk")
                self.errors.append(self.lines[-1])
                continue
            start, rows = self._verifying.pop(key)
            self._tracker.rollback(key, start + kept)
            self.lines.append(f"commit_verify s{key} keep {kept}/{rows}")

    def _check_sequence(
        self,
        i: int,
        key: int,
        lo: int,
        hi: int,
        ctx: int,
        positions: list[int],
        table: Sequence[int],
        kv: PagedKVCache,
        pending: list[str],
        fed: Sequence[int] = (),
    ) -> bool:
        """Layout and KV readback of sequence ``i``; appends error lines, returns clean.
        ``fed`` (a verify chunk's rows) is what its positions must hold past the first row."""
        script = self.scripts.get(key)
        if script is None:
            pending.append(f"error: sequence {i} reads first token {key}, which no script starts with")
            return False
        expected_positions = list(range(ctx - (hi - lo), ctx))
        if positions[lo:hi] != expected_positions:
            pending.append(
                f"error: s{key} rows at positions {positions[lo:hi]}, expected "
                f"{expected_positions[0]}..{expected_positions[-1]} (context_len {ctx})"
            )
            return False
        return self._readback(key, script, 0, ctx, table, kv, pending, fed)

    def _check_state(
        self, key: int, start: int, fresh: bool, slot: int, state: object | None, pending: list[str]
    ) -> bool:
        """Recurrent-mode contract: state_fresh exactly at 0, a valid slot that holds this key."""
        if not self.recurrent_fed_rows:
            return True
        if fresh != (start == 0):
            pending.append(f"error: s{key} state_fresh={fresh} at start {start}")
            self._tracker.corrupt(key)
            return False
        if not isinstance(state, StatePool) or not 0 <= slot < len(state.owners):
            pending.append(f"error: s{key} has state slot {slot}, outside the pool it was given")
            self._tracker.corrupt(key)
            return False
        if fresh:
            state.owners[slot] = key
        elif state.owners[slot] != key:
            pending.append(
                f"error: s{key} continues in state slot {slot}, which holds the state of s{state.owners[slot]}"
            )
            self._tracker.corrupt(key)
            return False
        return True
