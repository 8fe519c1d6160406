"""KDA (Kimi Delta Attention) maths in torch: gates, short conv, recurrent and chunked forms.

Owner: ``metrale_glm_kda``.  These functions are the oracles of the CUDA kernels
(``kernels/kda_decode.cu``, ``kernels/short_conv.cu``) and the CPU path of the model.

Invariants:
- The recurrent state is float32 ``[H, K, V]`` (key rows, value columns), batched as
  ``[B, H, K, V]``; every recurrence runs in float32.
- ``q`` handed to the recurrences is already L2-normalised and scaled by ``K ** -0.5``; ``k`` is
  L2-normalised; ``g`` is the per-channel log decay ``[.., H, K]`` (<= 0); ``beta`` is ``[.., H]``.
- The output is read after the write: ``o_t = S_t^T q_t`` (specs §2.1).
- ``kda_chunked`` (chunk 64, WY/UT form) equals ``kda_recurrent`` to ~1e-5 in float32 for any
  length and initial state; it never materialises more than one chunk's ``[H, C, C, K]`` decay.
- The conv state holds the last ``kernel - 1`` *pre-conv* inputs, oldest first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "CHUNK",
    "conv_decode",
    "conv_prefill",
    "forget_gate",
    "gated_rms_norm",
    "kda_chunked",
    "kda_recurrent",
    "l2norm",
    "prepare_qk",
]

#: Chunk length of the chunked (WY) form.
CHUNK = 64


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dimension (FLA / transformers form)."""
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def prepare_qk(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 L2-normalised ``q * K**-0.5`` and ``k`` (``[.., H, K]``)."""
    q, k = l2norm(q.float()), l2norm(k.float())
    return q * q.shape[-1] ** -0.5, k


def forget_gate(
    raw: torch.Tensor, dt_bias: torch.Tensor, a_log: torch.Tensor, lower_bound: float | None
) -> torch.Tensor:
    """Log decay ``g`` ``[T, H, K]`` from ``raw = f_b(f_a(x))`` ``[T, H*K]`` (specs §2.2).

    Lower-bound form: ``lb * sigmoid(exp(A_log) * (raw + dt_bias))``; softplus form:
    ``-exp(A_log) * softplus(raw + dt_bias)`` (linear above 20).
    """
    heads = a_log.numel()
    g = (raw.float() + dt_bias.float()).view(raw.shape[0], heads, -1)
    rate = torch.exp(a_log.float()).view(1, heads, 1)
    if lower_bound is not None:
        return lower_bound * torch.sigmoid(rate * g)
    return -rate * torch.where(g > 20.0, g, torch.log1p(torch.exp(g)))


def gated_rms_norm(
    o: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype
) -> torch.Tensor:
    """``weight * rmsnorm(o) * sigmoid(gate)`` per head in float32, cast to ``dtype``."""
    o = o.float()
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * o * torch.sigmoid(gate.float())).to(dtype)


def conv_prefill(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv + SiLU over one sequence's rows.

    ``x`` ``[n, C]`` raw projections, ``state`` ``[C, W-1]`` (the previous ``W-1`` inputs,
    oldest first), ``weight`` ``[C, W]``.  Returns ``(y [n, C] in x.dtype, new_state [C, W-1])``.
    """
    width = weight.shape[-1]
    seq = torch.cat([state.to(weight.dtype), x.t().to(weight.dtype)], dim=-1)  # [C, W-1+n]
    y = F.conv1d(seq.unsqueeze(0), weight.unsqueeze(1), groups=weight.shape[0])[0]  # [C, n]
    return F.silu(y).t().to(x.dtype), seq[:, seq.shape[-1] - (width - 1) :].to(state.dtype)


def conv_decode(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One new input per sequence: ``x`` ``[B, C]``, ``state`` ``[B, C, W-1]`` -> ``(y [B, C], new_state)``."""
    window = torch.cat([state.to(weight.dtype), x.to(weight.dtype).unsqueeze(-1)], dim=-1)  # [B, C, W]
    y = F.silu((window * weight).sum(-1))
    return y.to(x.dtype), window[..., 1:].to(state.dtype)


def kda_recurrent(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token KDA over ``[T, B, H, *]`` inputs with state ``[B, H, K, V]``.

    Returns ``(o [T, B, H, V] float32, final state)``; ``state`` is not modified.
    """
    s = state.float().clone()
    v, g, beta = v.float(), g.float(), beta.float()
    out = torch.empty(*v.shape, dtype=torch.float32, device=v.device)
    for t in range(q.shape[0]):
        s = s * torch.exp(g[t]).unsqueeze(-1)
        mem = torch.einsum("bhkv,bhk->bhv", s, k[t])
        u = beta[t].unsqueeze(-1) * (v[t] - mem)
        s = s + k[t].unsqueeze(-1) * u.unsqueeze(-2)
        out[t] = torch.einsum("bhkv,bhk->bhv", s, q[t])
    return out, s


def kda_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked (WY / UT) KDA over one sequence: ``q, k, g`` ``[T, H, K]``, ``v`` ``[T, H, V]``,
    ``beta`` ``[T, H]``, ``state`` ``[H, K, V]``.  Returns ``(o [T, H, V] float32, final state)``.

    Per chunk: ``T = (I + strict_lower(k_beta k^T * decay))^-1`` by a unit-lower triangular solve,
    ``U = T v_beta``, ``W = T (k_beta * exp(G))``, then the state update of specs §2.6.
    """
    n = q.shape[0]
    pad = (-n) % chunk
    # [H, T, *] float32, padded to whole chunks (zero k/v/beta/g leave the state unchanged)
    q, k, v, g = (F.pad(x.float().transpose(0, 1), (0, 0, 0, pad)) for x in (q, k, v, g))
    beta = F.pad(beta.float().transpose(0, 1), (0, pad))
    s = state.float().clone()
    out = torch.empty_like(v)
    eye = torch.eye(chunk, dtype=torch.float32, device=q.device)
    strict = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(0)  # j >= i masked
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)  # j > i masked
    for c0 in range(0, n + pad, chunk):
        sl = slice(c0, c0 + chunk)
        qc, kc, vc, bc = q[:, sl], k[:, sl], v[:, sl], beta[:, sl]
        gc = g[:, sl].cumsum(dim=1)  # [H, C, K] log decay from the chunk start, inclusive
        diff = gc.unsqueeze(2) - gc.unsqueeze(1)  # [H, C(i), C(j), K]: G_i - G_j
        decay = diff.masked_fill(causal.unsqueeze(-1), float("-inf")).exp()
        k_beta = kc * bc.unsqueeze(-1)
        lower = torch.einsum("hik,hjk,hijk->hij", k_beta, kc, decay).masked_fill(strict, 0.0)
        system = eye + lower  # unit lower triangular
        rhs = torch.cat([vc * bc.unsqueeze(-1), k_beta * gc.exp()], dim=-1)
        solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        u, w = solved.split([vc.shape[-1], kc.shape[-1]], dim=-1)
        aqk = torch.einsum("hik,hjk,hijk->hij", qc, kc, decay).masked_fill(causal, 0.0)
        v_new = u - w @ s
        out[:, sl] = (qc * gc.exp()) @ s + aqk @ v_new
        last = gc[:, -1:]  # [H, 1, K]
        s = s * last.transpose(1, 2).exp() + (kc * (last - gc).exp()).transpose(1, 2) @ v_new
    return out[:, :n].transpose(0, 1), s
