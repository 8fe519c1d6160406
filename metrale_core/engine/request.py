"""``EngineRequest`` (a checked request on its way in), ``Request`` (what a client asked for, as
accepted) and ``Sequence`` (its mutable state inside the engine).

Owner: ``LLMEngine.validate_request`` builds an ``EngineRequest`` (the only record that crosses
to the engine thread or a replica's pipe); ``LLMEngine.add_request`` turns it into a ``Request``
and a ``Sequence``; the scheduler moves a ``Sequence`` between the waiting queue, the running
list and FINISHED; the output processor appends its tokens.

Invariants:
- An ``EngineRequest`` has passed every check that does not depend on the engine's state (its
  prompt, sampling parameters and logit processors, ``timeout_s``, ``extras``) exactly once,
  under its own id; ``add_request`` takes it as it is (only the id's uniqueness is checked then).
- ``num_computed_tokens`` counts the tokens whose K/V (and recurrent state) the model has
  consumed; tokens ``[num_computed_tokens, num_tokens)`` are still to be fed.  A token is never
  fed twice while the sequence keeps its blocks: preemption resets ``num_computed_tokens`` to 0
  and frees everything, so the history is replayed from position 0 (fresh recurrent state).
- ``block_ids[i]`` holds positions ``i*block_size .. (i+1)*block_size - 1`` (KV group 0);
  ``group_block_ids[g - 1]`` is KV group ``g``'s table, as long, where a block that slid out of
  the group's window is ``NULL_BLOCK`` (only with attention windows; see ``block_manager``).
- A ``Sequence`` is a ``RowLike`` for the logit pipeline (params, prompt_ids, output_ids,
  generator, extras).
- ``repr`` never dumps token ids (only lengths).
"""

from __future__ import annotations

import enum
import random
from typing import TYPE_CHECKING

import torch
from attrs import define, field, frozen

from metrale_core.sampling.params import SamplingParams, as_tuple

if TYPE_CHECKING:
    from metrale_core.text.detokenizer import IncrementalDetokenizer

__all__ = ["EngineRequest", "FinishReason", "Request", "Sequence", "SequenceStatus"]

#: Why a sequence finished (the OpenAI ``finish_reason`` plus engine outcomes).
FinishReason = str  # "stop" | "length" | "abort" | "timeout" | "error"


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@frozen(repr=False)
class EngineRequest:
    """A request the engine's checks accepted, as it travels to the engine (thread or replica).

    Build it with ``LLMEngine.validate_request`` (never by hand: that is what makes it checked).
    """

    request_id: str
    prompt_ids: tuple[int, ...] = field(converter=as_tuple)
    params: SamplingParams
    #: Seconds after arrival at which it finishes with ``"timeout"`` (None: the engine's default).
    timeout_s: float | None = None
    #: Per-sequence plugin state to seed ``Sequence.extras`` with (e.g. ``{"stream_parser": ...}``,
    #: ``{"pooling": ...}``, the LoRA adapter key); the engine thread alone touches it once sent.
    extras: dict | None = None

    def __repr__(self) -> str:
        return f"EngineRequest({self.request_id!r}, prompt_len={len(self.prompt_ids)}, timeout_s={self.timeout_s})"


@frozen(repr=False)
class Request:
    """One generation request as the client sent it."""

    request_id: str
    prompt_ids: tuple[int, ...] = field(converter=as_tuple)
    params: SamplingParams
    #: Clock time the engine accepted it.
    arrival_time: float = 0.0
    #: Clock time after which it finishes with ``"timeout"`` (None = never).
    deadline: float | None = None

    def __repr__(self) -> str:
        return f"Request({self.request_id!r}, prompt_len={len(self.prompt_ids)}, deadline={self.deadline})"


def _new_generator(seed: int | None) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(seed if seed is not None else random.getrandbits(63))
    return gen


@define(repr=False, eq=False)
class Sequence:
    """The engine-side state of one request."""

    request: Request
    #: Arrival order (monotonic counter); FCFS admits in this order.
    order: int
    status: SequenceStatus = SequenceStatus.WAITING
    output_ids: list[int] = field(factory=list)
    num_computed_tokens: int = 0
    #: Tokens the current prefill must reach before sampling resumes (the prompt at first, the
    #: prompt plus generated tokens after a preemption).
    num_prefill_tokens: int = 0
    #: Tokens reused from the prefix cache at the last admission.
    num_cached_tokens: int = 0
    block_ids: list[int] = field(factory=list)
    #: Block tables of the KV groups after the first (empty without attention windows).
    group_block_ids: list[list[int]] = field(factory=list)
    #: Recurrent-state slot while running (-1 when none).
    state_slot: int = -1
    generator: torch.Generator | None = None
    #: Per-sequence plugin state, keyed by plugin name.
    extras: dict = field(factory=dict)
    finish_reason: str | None = None
    error: str | None = None
    num_preemptions: int = 0
    #: Output-side state (owned by the output processor).
    detokenizer: IncrementalDetokenizer | None = None
    text: str = ""
    num_text_emitted: int = 0

    def __attrs_post_init__(self) -> None:
        if self.generator is None:
            self.generator = _new_generator(self.request.params.seed)
        if self.num_prefill_tokens == 0:
            self.num_prefill_tokens = len(self.request.prompt_ids)

    # --- RowLike -----------------------------------------------------------------------------
    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        return self.request.prompt_ids

    # --- bookkeeping -------------------------------------------------------------------------
    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def deadline(self) -> float | None:
        return self.request.deadline

    @property
    def num_tokens(self) -> int:
        return len(self.request.prompt_ids) + len(self.output_ids)

    def token_ids(self, start: int, stop: int) -> tuple[int, ...]:
        """Tokens ``[start, stop)`` of prompt + output."""
        prompt = self.request.prompt_ids
        n = len(prompt)
        if stop <= n:
            return tuple(prompt[start:stop])
        return tuple(prompt[start:]) + tuple(self.output_ids[max(0, start - n) : stop - n])

    def all_token_ids(self) -> tuple[int, ...]:
        return self.request.prompt_ids + tuple(self.output_ids)

    @property
    def is_prefilling(self) -> bool:
        """True until the current prefill (prompt, or replayed history) is fully consumed."""
        return self.num_computed_tokens < self.num_prefill_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def pools(self) -> bool:
        """True for a pooling (embedding) request, whose extras hold its ``pooling`` record
        (``metrale_core.engine.pooling``): its prompt never matches the prefix cache, and a step
        with its rows keeps hidden states."""
        return "pooling" in self.extras

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, prompt_len="
            f"{len(self.request.prompt_ids)}, outputs={len(self.output_ids)}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_ids)})"
        )
