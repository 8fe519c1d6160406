"""``MtpProposer``: a checkpoint's DeepSeek-style MTP layer drafts k tokens (specs §4.3).

Owner: registered as proposer ``mtp`` (``--speculative mtp --draft-model <checkpoint>``).

The MTP layer ``L = num_hidden_layers`` holds ``enorm``, ``hnorm``, ``eh_proj`` ``[D, 2D]``,
``shared_head.{norm,head}`` and one ordinary decoder layer.  The decoder layer, with
``shared_head`` as its final norm and head, is built by the target's own model loader as a
one-layer model (tensor names mapped onto ``model.layers.0.*``), so it runs over its own paged
KV cache through the model contract; it must offer ``forward_with_hidden(inputs_embeds=)``.

MTP row for target position ``p``: ``u = eh_proj([enorm(embed(x_{p+1})), hnorm(h_p)])``
(embedding zeroed at ``p == 0``), with ``h_p`` the target's final-normed hidden state; its
logits predict ``x_{p+2}``.  Per step: catch up over the committed positions whose hidden
states arrived (``observe``; prefill chunks included, so the prompt populates the MTP cache),
the last of which gives ``d_1``; then ``d_{j+1}`` from ``(d_j, h'_j)``, ``h'`` the MTP layer's
own (normed) output.

Invariants: the MTP cache holds committed positions only (drafts are overwritten next step);
the MTP positions start at the first target position with a hidden state (a prefix-cache hit
or a gap restarts there); ``wants_hidden`` is True so the engine returns hidden states.
Deviation: the chained steps feed the *normed* ``h'`` (the block returns normed states).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

import torch
import torch.nn.functional as F
from attrs import define, field

from metrale_core.api import ConfigError, Draft, StepReport, rms_norm
from metrale_speculative.drafting import sample_drafts
from metrale_speculative.side_cache import SideCache

__all__ = ["MtpProposer", "MtpStore"]


class MtpStore:
    """A weight store that shows the MTP layer ``L`` of ``store`` as a one-layer model."""

    def __init__(self, store: Any, index: int) -> None:
        self._store = store
        self._p = f"model.layers.{index}."
        self.config = dict(store.config, num_hidden_layers=1, tie_word_embeddings=False)
        self.format = getattr(store, "format", "safetensors")

    def _name(self, name: str) -> str:
        if name.startswith("model.layers.0."):
            return self._p + name[len("model.layers.0.") :]
        if name == "model.norm.weight":
            return self._p + "shared_head.norm.weight"
        if name == "lm_head.weight":
            return self._p + "shared_head.head.weight"
        if name == "model.embed_tokens.weight" and (self._p + "embed_tokens.weight") in self._store:
            return self._p + "embed_tokens.weight"
        return name

    def __contains__(self, name: str) -> bool:
        return self._name(name) in self._store

    def names(self) -> list[str]:
        return [n for n in self._store.names() if n.startswith(self._p)]

    def get(self, name: str, **kwargs) -> torch.Tensor:
        return self._store.get(self._name(name), **kwargs)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._store.shape(self._name(name)))

    def quant_type(self, name: str) -> Any:
        return self._store.quant_type(self._name(name))

    def get_raw(self, name: str, *args, **kwargs) -> Any:
        return self._store.get_raw(self._name(name), *args, **kwargs)


@define(eq=False)
class _Track:
    """Hidden states of one sequence not yet fed to the MTP layer."""

    #: Target position of MTP position 0.
    base: int
    #: Hidden rows of target positions ``base + fed ..``.
    pending: list = field(factory=list)


class MtpProposer:
    """Drafts with the MTP layer over its own KV cache."""

    wants_hidden = True

    def __init__(
        self,
        block: Any,
        embed: torch.Tensor,
        enorm: torch.Tensor,
        hnorm: torch.Tensor,
        eh_proj: torch.Tensor,
        eps: float,
        pipeline: Any,
        *,
        num_blocks: int,
        block_size: int,
    ) -> None:
        self.block, self.embed, self.enorm, self.hnorm, self.eh_proj = block, embed, enorm, hnorm, eh_proj
        self.eps = eps
        self.pipeline = pipeline
        self.cache = SideCache(block, num_blocks, block_size)
        self.tracks: dict[str, _Track] = {}

    def __repr__(self) -> str:
        return f"MtpProposer({self.block.info.architecture})"

    @classmethod
    def from_checkpoint(
        cls,
        path: Any,
        target: Any,
        pipeline: Any,
        *,
        max_model_len: int,
        block_size: int,
        registry: Any = None,
        load: Any = None,
    ) -> MtpProposer:
        """The MTP layer of checkpoint ``path``.  ``load(store)`` builds it: the engine's
        ``ProposerContext.load_model`` (the target's loading function and registry); without
        it, ``model_from_store`` with ``registry`` (tests and scripts)."""
        from metrale_core.api import LoadOptions, model_device, open_weights

        store = open_weights(path)
        index = int(store.config["num_hidden_layers"])
        p = f"model.layers.{index}."
        missing = [
            n
            for n in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.head.weight")
            if p + n not in store
        ]
        if missing:
            raise ConfigError(
                f"{path} has no MTP layer {index} (missing {', '.join(p + n for n in missing)}); "
                "use --speculative ngram or draft for this checkpoint"
            )
        device = model_device(target)
        dtype = target.info.dtype
        mtp_store = MtpStore(store, index)
        if load is not None:
            block = load(mtp_store)
        else:
            from metrale_core.api import load_registry, model_from_store

            registry = registry if registry is not None else load_registry()
            options = LoadOptions(dtype=str(dtype).removeprefix("torch."), device=str(device))
            block = model_from_store(mtp_store, options, registry)[1]
        if not hasattr(block, "forward_with_hidden"):
            raise ConfigError(
                f"the {block.info.architecture} loader's model has no "
                "forward_with_hidden(inputs_embeds=...); it cannot run an MTP layer"
            )
        d = int(store.config["hidden_size"])

        def get(name, shape):
            return store.get(name, dtype=dtype, shape=shape).to(device)

        embed_name = p + "embed_tokens.weight" if p + "embed_tokens.weight" in store else "model.embed_tokens.weight"
        need = -(-max_model_len // block_size)
        return cls(
            block,
            get(embed_name, (target.info.vocab_size, d)),
            get(p + "enorm.weight", (d,)),
            get(p + "hnorm.weight", (d,)),
            get(p + "eh_proj.weight", (d, 2 * d)),
            float(store.config.get("rms_norm_eps", 1e-6)),
            pipeline,
            num_blocks=max(need, 4 * need),
            block_size=block_size,
        )

    # --- hidden states from the target ---------------------------------------------------------
    def observe(self, report: StepReport) -> None:
        if report.hidden is None or report.plan is None:
            return
        row = 0
        for chunk in report.plan.chunks:
            rid = chunk.seq.request_id
            n = report.committed_rows.get(rid)
            if n is not None:
                track = self.tracks.get(rid)
                fed = self.cache.seqs[rid].computed if rid in self.cache.seqs else 0
                if track is None or chunk.start == 0 or chunk.start != track.base + fed + len(track.pending):
                    track = self.tracks[rid] = _Track(base=chunk.start)
                    self.cache.retain(r for r in self.cache.seqs if r != rid)
                track.pending.extend(report.hidden[row : row + n])
            row += chunk.num_tokens
        live = {c.seq.request_id for c in report.plan.chunks if c.seq.request_id in report.committed_rows}
        for rid in [r for r in self.tracks if r not in live and r not in self.cache.seqs]:
            del self.tracks[rid]

    # --- drafting ------------------------------------------------------------------------------
    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, w, self.eps, cast="weight")  # this head's cast order (see rms_norm)

    def _inputs(self, tokens: list[int], hidden: torch.Tensor, positions: list[int]) -> torch.Tensor:
        e = F.embedding(torch.tensor(tokens, device=self.embed.device), self.embed)
        e = e * torch.tensor([p != 0 for p in positions], device=e.device, dtype=e.dtype)[:, None]
        u = torch.cat([self._rms(e, self.enorm), self._rms(hidden.to(e.dtype), self.hnorm)], dim=-1)
        return F.linear(u, self.eh_proj)

    def _run(self, rows: list[tuple[Any, int, list[int], torch.Tensor, list[int]]]):
        """rows: (draft seq, mtp start, input tokens, hidden [n, D], target positions)."""
        cache = self.cache
        plan = cache.plan([cache.chunk(ds, start, tuple(toks)) for ds, start, toks, _, _ in rows])
        batch = cache.runner.build_batch(plan)
        u = torch.cat([self._inputs(toks, h, pos) for _, _, toks, h, pos in rows])
        logits, hidden = self.block.forward_with_hidden(batch, cache.runner.kv, None, inputs_embeds=u)
        last = batch.logits_rows
        return logits.float(), hidden[last]

    def propose(self, seqs: Seq[Any], max_drafts: Seq[int]) -> list[Draft | None]:
        self.cache.retain(seq.request_id for seq in seqs)
        live = []  # (index, seq, draft seq, cap, catch-up row)
        for i, (seq, cap) in enumerate(zip(seqs, max_drafts)):
            track = self.tracks.get(seq.request_id)
            if cap <= 0 or track is None or not track.pending:
                continue
            ds = self.cache.reserve(seq.request_id, seq.num_tokens - 1 - track.base + cap)
            if ds is None:
                continue
            first = track.base + ds.computed
            if first + len(track.pending) != seq.num_tokens - 1:
                continue  # hidden states do not reach the last committed position yet
            tokens = seq.all_token_ids()
            positions = list(range(first, seq.num_tokens - 1))
            row = (ds, ds.computed, [tokens[p + 1] for p in positions], torch.stack(track.pending), positions)
            live.append((i, seq, ds, cap, row))
        drafts: list[list[int]] = [[] for _ in seqs]
        probs: list[list] = [[] for _ in seqs]
        step = 0
        while live:
            logits, hidden = self._run([entry[4] for entry in live])
            tokens, qs = sample_drafts(self.pipeline, logits, [e[1] for e in live], [drafts[e[0]] for e in live])
            nxt = []
            for (i, seq, ds, cap, _row), token, q, h in zip(live, tokens, qs, hidden):
                drafts[i].append(token)
                probs[i].append(q)
                if step == 0:
                    track = self.tracks[seq.request_id]
                    ds.computed += len(track.pending)
                    track.pending = []
                if len(drafts[i]) < cap:
                    p = seq.num_tokens - 2 + len(drafts[i])
                    mtp_pos = ds.computed + len(drafts[i]) - 1
                    nxt.append((i, seq, ds, cap, (ds, mtp_pos, [token], h[None, :], [p])))
            live = nxt
            step += 1
        out: list[Draft | None] = []
        for d, p in zip(drafts, probs):
            if not d:
                out.append(None)
            elif any(q is None for q in p):
                out.append(Draft(d))
            else:
                out.append(Draft(d, torch.stack(p)))
        return out
