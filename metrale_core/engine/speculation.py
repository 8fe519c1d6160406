"""Speculative decoding, engine side: the ``Speculator`` contract and the lossless acceptance rule.

Owner: ``LLMEngine`` builds one ``Speculator`` (from the ``ProposerSpec`` named by
``EngineConfig.speculative``) and asks it for drafts once per step; the scheduler turns a decode
row with a draft ``d1..dk`` into a verify chunk ``[last, d1..dk]`` (kind ``VERIFY``); the output
processor runs the logit pipeline on all k+1 rows with ``PositionKind.VERIFY`` and calls
:func:`accept` per sequence; the accepted tokens are then committed one by one through the normal
append path.

The rule (specs §4.1/4.2/4.5), on the *processed* distributions (the pipeline's
``processed_logits``: processors, penalties, bias, temperature, top-k/p, min-p), row ``i`` of the
target predicting the token after input ``i``:
- greedy (temperature 0): accept ``d_i`` while it equals the target's argmax; emit the argmax at
  the first mismatch, or the bonus argmax of row k+1 when all are accepted;
- sampled: ``r ~ U[0,1)`` from the request's generator; accept ``d_i`` iff ``q_i(d_i) > 0`` and
  ``r < p_i(d_i) / q_i(d_i)`` (``q`` one-hot when the proposer gives no probabilities, e.g.
  n-gram); on rejection emit ``y ~ normalize(max(0, p_i - q_i))`` and stop; when all k are
  accepted emit the bonus ``y ~ p_{k+1}``.  The output then follows ``p`` exactly.

Invariants:
- :func:`accept` never modifies its inputs and draws random numbers only from the row's
  generator (one per draft tested, one for the emitted token); greedy rows draw none.
- A verify row's history (penalties) is the committed output plus the drafts before it
  (:class:`VerifyRow`), so ``p_i`` is exactly the distribution plain decoding would use after
  accepting ``d_1..d_{i-1}``.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from attrs import field, frozen

from metrale_core.sampling.sampler import inverse_cdf

if TYPE_CHECKING:
    from metrale_core.plugin.registry import Registry

__all__ = [
    "SPECULATIVE_EXTRA",
    "Draft",
    "ProposerContext",
    "Speculator",
    "StepReport",
    "Verdict",
    "VerifyOutcome",
    "VerifyRow",
    "accept",
]

#: ``seq.extras[SPECULATIVE_EXTRA] = False`` opts one request out of speculation.
SPECULATIVE_EXTRA = "speculative"


def _tuple_ints(values) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


@frozen
class Draft:
    """Draft tokens for one sequence and, when the proposer samples them, their distributions."""

    token_ids: tuple[int, ...] = field(converter=_tuple_ints)
    #: ``[len(token_ids), V]`` probabilities ``q_i`` each draft was sampled from (processed with
    #: the same pipeline as the target); None means point masses (n-gram, greedy drafting).
    probs: torch.Tensor | None = field(default=None, eq=False)

    def truncated(self, n: int) -> Draft:
        if n >= len(self.token_ids):
            return self
        return Draft(self.token_ids[:n], None if self.probs is None else self.probs[:n])


@frozen
class Verdict:
    """What :func:`accept` decided for one verify chunk."""

    #: Drafts accepted (0..k).
    num_accepted: int
    #: Tokens to commit, in order: the accepted drafts, then the recovered or bonus token.
    token_ids: tuple[int, ...]


@frozen(repr=False)
class VerifyRow:
    """The ``RowLike`` of verify row ``i``: the sequence with drafts ``d_1..d_i`` appended to its
    output history (read by penalties and processors)."""

    seq: Any = field(eq=False)
    output_ids: tuple[int, ...]

    @property
    def params(self):
        return self.seq.params

    @property
    def prompt_ids(self):
        return self.seq.prompt_ids

    @property
    def generator(self):
        return self.seq.generator

    @property
    def extras(self) -> dict:
        return self.seq.extras

    def __repr__(self) -> str:
        return f"VerifyRow({self.seq.request_id!r}, outputs={len(self.output_ids)})"


def verify_rows(seq: Any, draft: Seq[int]) -> list[VerifyRow]:
    """The k+1 rows of a verify chunk of ``seq`` with drafts ``draft``."""
    base = tuple(seq.output_ids)
    return [VerifyRow(seq, base + tuple(draft[:i])) for i in range(len(draft) + 1)]


def _uniform(generator: torch.Generator | None) -> float:
    gen_device = generator.device if generator is not None else "cpu"
    return float(torch.rand(1, generator=generator, device=gen_device).item())


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    u = torch.tensor([_uniform(generator)], dtype=probs.dtype)
    return int(inverse_cdf(probs[None, :].cpu(), u)[0])


def accept(
    processed: torch.Tensor,
    draft: Seq[int],
    draft_probs: torch.Tensor | None,
    *,
    greedy: bool,
    generator: torch.Generator | None,
) -> Verdict:
    """Apply the acceptance rule to one verify chunk (see the module docstring).

    ``processed`` is ``[k+1, V]`` processed target logits (removed tokens ``-inf``).
    """
    k = len(draft)
    if processed.shape[0] != k + 1:
        raise ValueError(f"verify needs {k + 1} target rows for {k} drafts, got {processed.shape[0]}")
    if greedy:
        targets = processed.argmax(dim=-1).tolist()
        n = 0
        while n < k and int(draft[n]) == targets[n]:
            n += 1
        return Verdict(n, tuple(int(t) for t in draft[:n]) + (int(targets[n]),))
    p = torch.softmax(processed.float(), dim=-1).cpu()
    q = None if draft_probs is None else draft_probs.float().cpu()
    for i in range(k):
        d = int(draft[i])
        q_d = 1.0 if q is None else float(q[i, d])
        p_d = float(p[i, d])
        if q_d > 0.0 and _uniform(generator) < p_d / q_d:
            continue
        if q is None:
            residual = p[i].clone()
            residual[d] = 0.0
        else:
            residual = (p[i] - q[i]).clamp_min(0.0)
        if not float(residual.sum()) > 0.0:
            residual = p[i]
        return Verdict(i, tuple(int(t) for t in draft[:i]) + (_draw(residual, generator),))
    return Verdict(k, tuple(int(t) for t in draft) + (_draw(p[k], generator),))


@frozen
class VerifyOutcome:
    """One verify chunk after acceptance (the engine reports these to the speculator)."""

    request_id: str
    #: Drafts verified (k) and accepted (0..k).
    num_proposed: int
    num_accepted: int
    #: Tokens committed this step (fewer than ``num_accepted + 1`` when a stop rule ended the
    #: sequence mid-draft).
    num_emitted: int
    #: The sequence finished this step.
    finished: bool


@frozen
class StepReport:
    """What the engine tells the speculator after each step that had decode rows."""

    #: Decode rows (plain or verify) in the step: the batch width.
    num_decode_seqs: int
    #: Verify chunks among them.
    outcomes: tuple[VerifyOutcome, ...]
    #: Tokens committed this step by decode rows (plain and verify).
    num_emitted: int
    #: Seconds the step took, drafting included (the engine clock; 0 with a frozen test clock).
    duration_s: float
    #: Prefill tokens in the same step (a step mixing prefill is no clean decode measurement).
    num_prefill_tokens: int = 0
    #: The plan of the step and, when the speculator wants them, the target's final-normed
    #: hidden states of every row of the plan (``[T, D]``, rows in plan order); None otherwise.
    plan: Any = field(default=None, eq=False)
    hidden: torch.Tensor | None = field(default=None, eq=False)
    #: request id -> rows of that sequence's chunk whose inputs are committed (a verify chunk
    #: keeps ``1 + num_accepted``); sequences that finished are absent.
    committed_rows: dict = field(factory=dict, eq=False)


@frozen
class ProposerContext:
    """What a ``ProposerSpec.factory(ctx)`` receives."""

    #: The ``EngineConfig`` (``num_draft_tokens``, ``draft_model``, ``clock``, ...).
    config: Any
    #: The target model.
    model: Any
    #: The engine's ``LogitPipeline`` (drafts must be sampled from its processed distributions).
    pipeline: Any
    #: The plugin registry (to load a draft model), or None.
    registry: Registry | None
    max_model_len: int

    def load_model(self, source: Any, options: Any = None) -> Any:
        """A side model (draft model, MTP layer) from ``source`` (a checkpoint path or an open
        ``WeightStore``), built by the engine's registry through the same loading function as
        the target (``metrale_core.loading.model_build.model_from_store``); by default with the target's
        dtype and device."""
        from metrale_core.engine.runner import model_device
        from metrale_core.errors import ConfigError
        from metrale_core.loading.model_build import model_from_store
        from metrale_core.plugin.components import LoadOptions
        from metrale_core.weights import open_weights

        if self.registry is None:
            raise ConfigError(
                "loading a draft model needs the plugin registry; build the engine with registry=load_registry()"
            )
        if options is None:
            options = LoadOptions(
                dtype=str(self.model.info.dtype).removeprefix("torch."), device=str(model_device(self.model))
            )
        store = open_weights(source) if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__") else source
        return model_from_store(store, options, self.registry)[1]

    def side_pool(self, model: Any, num_blocks: int) -> Any:
        """A ``SidePool`` (runner + block manager) for ``model`` with the engine's block size."""
        from metrale_core.engine.side_pool import SidePool

        return SidePool(model, num_blocks, self.config.block_size)


@runtime_checkable
class Speculator(Protocol):
    """The engine's draft source (built by a ``ProposerSpec`` factory)."""

    #: True when the runner must return the target's hidden states (MTP heads).
    wants_hidden: bool

    def propose(self, seqs: Seq[Any], max_drafts: Seq[int]) -> list[Draft | None]:
        """Drafts for the running decode sequences ``seqs`` (at most ``max_drafts[i]`` tokens
        each; None or an empty draft means a plain decode row)."""
        ...

    def observe(self, report: StepReport) -> None:
        """Called after every step that had decode rows (gate measurements, stats, MTP state)."""
        ...
